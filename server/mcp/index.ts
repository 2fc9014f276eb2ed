/** The gate as a Model Context Protocol server: Streamable HTTP on the API's listener, or stdio. */
export { createMcpServer, SERVER_INFO, type McpDeps } from './server.js';
export { registerMcpRoutes } from './http.js';
export { META_KEYS, META_PREFIX } from './context.js';
export { BUILTIN, OPERATION_URI_TEMPLATE } from './tools.js';
export { peerTag, sessionOwner, type McpPeers } from './peers.js';
