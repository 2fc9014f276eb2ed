export * from './db.js';
export * from './migrate.js';
export * from './service-lock.js';
