export { HttpServer, DRAIN_MS, type HttpServerOptions } from './http.js';
export { createMcpServer, META_KEYS, META_PREFIX, peerTag, type McpDeps, type McpPeers } from './mcp/index.js';
