/** Who is calling: principals, their roles per tenant, and API tokens (PostgreSQL is the store). */
export {
  PrincipalStore,
  PRINCIPAL_KINDS,
  tokenHash,
  type Authenticated,
  type CreatedToken,
  type PrincipalKind,
  type PrincipalRow,
  type TokenRow,
} from './store.js';
export { PrincipalCertificates, certificateFingerprint, type CertificateRow } from './certificates.js';
export {
  ConsoleSessions,
  consoleSessionQueries,
  type ConsoleSession,
  type CreatedLoginLink,
} from './console-sessions.js';
