export * from './cluster.js';
export * from './embedded.js';
