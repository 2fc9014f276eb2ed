/**
 * What a Streamable HTTP session needs of the MCP SDK, and the MCP server built on it: loaded by the first
 * session (http.ts), not at start. The SDK and its schemas are about a fifth of a second of CPU to load, which a
 * worker that never sees an MCP client need not pay.
 */
export { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
export { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
export { createMcpServer } from './server.js';
