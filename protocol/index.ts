export * from './authorization.js';
export * from './profile.js';
