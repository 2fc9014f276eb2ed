export * from './external-writes.js';
export * from './http-client.js';
export * from './mtls-json-server.js';
export * from './network-target.js';
