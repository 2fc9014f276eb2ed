export { HttpServer, type HttpServerOptions } from './http.js';
export { createMcpServer, META_KEYS, META_PREFIX, type McpDeps } from './mcp/index.js';
