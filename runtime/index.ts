export * from './identity.js';
export * from './runtime.js';
