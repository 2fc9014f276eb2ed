/**
 * Tool URLs that reach the development sandbox. One setting per port: a tool URL written as a path alone
 * (`/v1/refunds`) is the sandbox provider's, its origin taken from `sandbox.provider_port`, so moving the
 * sandbox (to run a second copy beside another) moves every such URL with it. A full URL on this machine (a
 * loopback host) while the sandbox runs with its own certificates (no `dispatcher.tls`) can only mean the sandbox
 * provider, since the dispatcher then trusts no other server: one at another port contradicts
 * `sandbox.provider_port` and is refused with its field named, rather than failing at the first dispatch
 * (`provider_unreachable`).
 */
import type { RawConfig } from './schema.js';
import type { ConfigProblems } from '../core/config-problems.js';

/** The host the sandbox's servers are reached by (their certificate names it, and 127.0.0.1 and ::1). */
export const SANDBOX_HOST = 'localhost';

/** How tool URLs are resolved and checked against the sandbox; null fields: the sandbox is off. */
export interface SandboxRouting {
  /** The sandbox provider's origin, `https://localhost:<sandbox.provider_port>`; null when the sandbox is off. */
  readonly providerOrigin: string | null;
  readonly providerPort: number;
  /** True when the dispatcher trusts only the sandbox's certificates (sandbox on, no `dispatcher.tls`). */
  readonly onlySandboxTrusted: boolean;
}

/** The origin of a sandbox server on `port`, canonical (no port for 443). */
export function sandboxOrigin(port: number): string {
  return port === 443 ? `https://${SANDBOX_HOST}` : `https://${SANDBOX_HOST}:${port}`;
}

/** The routing the configuration's sandbox section gives (off when any field it reads is malformed). */
export function sandboxRouting(cfg: RawConfig, problems: ConfigProblems): SandboxRouting {
  const off = { providerOrigin: null, providerPort: 0, onlySandboxTrusted: false };
  if (problems.malformed('/sandbox/enabled') || problems.malformed('/sandbox/provider_port')) return off;
  if (cfg.sandbox.enabled !== true) return off;
  const port = cfg.sandbox.provider_port;
  return {
    providerOrigin: sandboxOrigin(port),
    providerPort: port,
    onlySandboxTrusted: !problems.malformed('/dispatcher/tls') && cfg.dispatcher?.tls === undefined,
  };
}

/**
 * A tool URL as the dispatcher will use it: a path resolved against the sandbox provider, anything else as
 * written. Adds a problem at `path` for a path while the sandbox is off; returns null then.
 */
export function resolveToolUrl(
  path: string,
  url: string,
  sandbox: SandboxRouting,
  problems: ConfigProblems,
): string | null {
  if (!url.startsWith('/')) return url;
  if (sandbox.providerOrigin === null) {
    problems.add(
      path,
      'is a path, which names a URL of the sandbox provider, and /sandbox/enabled is not true: write a full https URL',
      { got: url },
    );
    return null;
  }
  return `${sandbox.providerOrigin}${url}`;
}

/** Loopback host names as `URL#hostname` spells them. */
function isLoopback(hostname: string): boolean {
  return hostname === 'localhost' || hostname === '[::1]' || /^127(\.\d{1,3}){3}$/.test(hostname);
}

/**
 * Adds a problem at `path` when a canonical absolute URL `url` (as written, `{effect_key}` in a template left
 * in place) is on this machine at a port other than the sandbox provider's while only the sandbox is trusted.
 */
export function sandboxPortProblem(path: string, url: string, sandbox: SandboxRouting, problems: ConfigProblems): void {
  if (!sandbox.onlySandboxTrusted || url.startsWith('/')) return;
  let parsed: URL;
  try {
    parsed = new URL(url.replaceAll('{', '%7B').replaceAll('}', '%7D'));
  } catch {
    return;
  }
  if (!isLoopback(parsed.hostname)) return;
  const port = parsed.port === '' ? 443 : Number(parsed.port);
  if (port === sandbox.providerPort) return;
  const rest = url.slice(url.indexOf('/', 'https://'.length));
  problems.add(
    path,
    `points at port ${port} on this machine, but the sandbox provider listens on /sandbox/provider_port ` +
      `(${sandbox.providerPort}), and with the sandbox's certificates (no /dispatcher/tls) nothing else there ` +
      `can answer: write the path alone, which follows /sandbox/provider_port`,
    { got: url, suggestion: rest },
  );
}
