/**
 * The sandbox component: a development/test PKI and real mutual-TLS stand-ins for a payment provider and for
 * the authorization service. Used by the tests and by `npm start`; never by the dispatcher itself.
 */
export {
  createCa,
  issueClientCert,
  issueServerCert,
  loadOrCreateDevPki,
  loadPki,
  writePki,
  type CertificateAuthority,
  type DevPki,
  type PemPair,
  type ServerCertOptions,
  type ValidityOptions,
} from './pki.js';
export type { ListenOptions, ServerTls } from '../transport/index.js';
export { startDevSandbox, type DevSandbox } from './dev.js';
export {
  SandboxProvider,
  type FaultSelector,
  type ProviderEffect,
  type ProviderFault,
  type ProviderRequest,
  type SandboxProviderOptions,
} from './provider.js';
export {
  SandboxAuthorizer,
  type AuthorizerFault,
  type AuthorizerFaultSelector,
  type AuthorizerRequestRecord,
  type Decision,
  type SandboxAuthorizerOptions,
} from './authorizer.js';
