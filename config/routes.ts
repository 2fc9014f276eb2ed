/**
 * The provider routes step of compiling the configuration: each tool's endpoint, readback and listing URLs
 * checked, and its compensation mapping resolved against the other routes. Problems are added to the caller's
 * list (every one is reported at once), skipping the parts the schema found malformed; the routes are returned
 * frozen (complete only when there are no problems: otherwise the configuration is refused anyway).
 */
import type { CompensationMapping, CompensationSource, ToolRoute } from './types.js';
import type { RawConfig, RawTool } from './schema.js';
import { isObject, nearest, pointer, type ConfigProblems } from '../core/config-problems.js';
import { canonicalHttpsProblem } from '../core/url.js';
import { resolveToolUrl, sandboxPortProblem, type SandboxRouting } from './sandbox-urls.js';

const SANDBOX_OFF: SandboxRouting = { providerOrigin: null, providerPort: 0, onlySandboxTrusted: false };

/** The placeholder a readback URL template must contain exactly once. */
export const EFFECT_KEY_PLACEHOLDER = '{effect_key}';

/**
 * `sandbox`: how a URL written as a path reaches the sandbox provider, and whether a URL on this machine must be
 * at its port (sandbox-urls.ts); off by default.
 */
export function compileRoutes(
  raw: RawConfig['tools'],
  problems: ConfigProblems,
  sandbox: SandboxRouting = SANDBOX_OFF,
): Map<string, ToolRoute> {
  const routes = new Map<string, ToolRoute>();
  if (!isObject(raw)) return routes;
  for (const [name, t] of Object.entries(raw)) {
    if (!isObject(t)) continue;
    const urls = toolUrls(name, t, sandbox, problems);
    const compensation = isObject(t.compensation) ? compensationMapping(name, t.compensation, raw, problems) : null;
    reservedHeaderProblem(name, t, problems);
    if (problems.malformed(pointer('tools', name))) continue;
    routes.set(
      name,
      Object.freeze({
        tool: name,
        providerId: t.provider_id,
        endpoint: urls.endpoint,
        allowedTenants: Object.freeze(new Set(t.allowed_tenants)),
        credentialEnv: t.credential_env ?? null,
        idempotencyHeader: t.idempotency.name,
        definitiveFailureStatuses: Object.freeze(new Set(t.definitive_failure_statuses)),
        releaseLimit: t.release_limit ?? null,
        readback: urls.readback === null ? null : Object.freeze({ urlTemplate: urls.readback }),
        effectsListingUrl: urls.listing,
        compensation,
      }),
    );
  }
  return routes;
}

/**
 * Header names the transport sets itself (the trace context while tracing is on, the body's framing, the
 * credential): an idempotency header of one of these names would be replaced or sent twice, and the provider
 * would lose the effect key it deduplicates on. Compared in any case, as HTTP does.
 */
export const RESERVED_IDEMPOTENCY_HEADERS: ReadonlySet<string> = new Set([
  'traceparent',
  'tracestate',
  'authorization',
  'content-type',
  'content-length',
  'host',
  'transfer-encoding',
]);

function reservedHeaderProblem(name: string, t: RawTool, problems: ConfigProblems): void {
  const header: unknown = isObject(t.idempotency) ? t.idempotency.name : undefined;
  if (typeof header !== 'string' || !RESERVED_IDEMPOTENCY_HEADERS.has(header.toLowerCase())) return;
  problems.add(
    pointer('tools', name, 'idempotency', 'name'),
    `${JSON.stringify(header)} is a header the transport sets itself; name the provider's idempotency header`,
  );
}

/**
 * A route's URLs as the dispatcher uses them (a path resolved against the sandbox provider), each checked: canonical
 * HTTPS, a readback template holding the effect key exactly once, and on this machine only at the sandbox
 * provider's port while only the sandbox is trusted. A URL with a problem comes back as written (the
 * configuration is refused anyway).
 */
function toolUrls(
  name: string,
  t: RawTool,
  sandbox: SandboxRouting,
  problems: ConfigProblems,
): { endpoint: string; readback: string | null; listing: string | null } {
  const check = (path: string, url: string, template: boolean): string => {
    if (problems.malformed(path)) return url;
    const resolved = resolveToolUrl(path, url, sandbox, problems);
    if (resolved === null) return url;
    const parts = template ? resolved.split(EFFECT_KEY_PLACEHOLDER) : [resolved];
    const p =
      template && parts.length !== 2
        ? `must contain ${EFFECT_KEY_PLACEHOLDER} exactly once`
        : canonicalHttpsProblem(parts.join('k'));
    if (p !== null) problems.add(path, p);
    else sandboxPortProblem(path, url, sandbox, problems);
    return resolved;
  };
  return {
    endpoint: check(pointer('tools', name, 'endpoint'), t.endpoint, false),
    readback: t.readback === undefined ? null : check(pointer('tools', name, 'readback', 'url'), t.readback?.url, true),
    listing:
      t.effects_listing_url === undefined
        ? null
        : check(pointer('tools', name, 'effects_listing_url'), t.effects_listing_url, false),
  };
}

/** A tool's declared inverse: another declared tool, each argument from the original or a literal. */
function compensationMapping(
  name: string,
  raw: NonNullable<RawTool['compensation']>,
  routes: RawConfig['tools'],
  problems: ConfigProblems,
): CompensationMapping | null {
  const where = pointer('tools', name, 'compensation');
  if (!problems.malformed(`${where}/tool`)) {
    if (!Object.hasOwn(routes, raw.tool)) {
      const suggestion = nearest(raw.tool, Object.keys(routes));
      problems.add(`${where}/tool`, `names ${JSON.stringify(raw.tool)}, which /tools does not declare`, {
        ...(suggestion === undefined ? {} : { suggestion }),
      });
    } else if (raw.tool === name) problems.add(`${where}/tool`, 'must be another tool');
  }
  if (!isObject(raw.arguments)) return null;
  const args: Record<string, CompensationSource> = {};
  for (const [arg, src] of Object.entries(raw.arguments)) {
    const at = `${where}/arguments${pointer(arg)}`;
    if (problems.malformed(at)) continue;
    if ('value' in src) args[arg] = Object.freeze({ value: src.value });
    else if (src.from === 'arguments') {
      if (src.pointer === undefined) problems.add(at, 'needs a pointer into the original arguments');
      args[arg] = Object.freeze({ from: 'arguments', pointer: src.pointer ?? '' });
    } else {
      if (src.pointer !== undefined) problems.add(at, 'takes a pointer only with from: arguments');
      args[arg] = Object.freeze({ from: src.from });
    }
  }
  return Object.freeze({ tool: raw.tool, arguments: Object.freeze(args) });
}
