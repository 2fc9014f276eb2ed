export { HttpServer, DRAIN_MS, type HttpServerOptions } from './http.js';
export { META_KEYS, META_PREFIX } from './mcp/context.js';
export { peerTag, type McpPeers } from './mcp/peers.js';
export type { McpDeps } from './mcp/server.js';

/** The MCP server factory (for stdio), loaded on first use: the MCP SDK is a fifth of a second of CPU to load. */
export async function loadMcpServer(): Promise<(typeof import('./mcp/server.js'))['createMcpServer']> {
  return (await import('./mcp/server.js')).createMcpServer;
}
