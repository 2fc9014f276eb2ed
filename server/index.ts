export { HttpServer, type HttpServerOptions } from './http.js';
