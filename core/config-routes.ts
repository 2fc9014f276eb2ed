/**
 * The provider routes step of compiling the configuration: each tool's endpoint, readback and listing URLs
 * checked, and its compensation mapping resolved against the other routes. Problems are appended to the
 * caller's list (every one is reported at once); the routes are returned frozen.
 */
import type { CompensationMapping, CompensationSource, ToolRoute } from './config.js';
import type { RawConfig, RawTool } from './config-schema.js';
import { canonicalHttpsProblem } from './url.js';

/** The placeholder a readback URL template must contain exactly once. */
export const EFFECT_KEY_PLACEHOLDER = '{effect_key}';

export function compileRoutes(raw: RawConfig['tools'], problems: string[]): Map<string, ToolRoute> {
  const routes = new Map<string, ToolRoute>();
  for (const [name, t] of Object.entries(raw)) {
    urlProblems(name, t, problems);
    routes.set(
      name,
      Object.freeze({
        tool: name,
        providerId: t.provider_id,
        endpoint: t.endpoint,
        allowedTenants: Object.freeze(new Set(t.allowed_tenants)),
        credentialEnv: t.credential_env ?? null,
        idempotencyHeader: t.idempotency.name,
        definitiveFailureStatuses: Object.freeze(new Set(t.definitive_failure_statuses)),
        readback: t.readback === undefined ? null : Object.freeze({ urlTemplate: t.readback.url }),
        effectsListingUrl: t.effects_listing_url ?? null,
        compensation: t.compensation === undefined ? null : compensationMapping(name, t.compensation, raw, problems),
      }),
    );
  }
  return routes;
}

/** Every URL of a route must be canonical HTTPS; a readback template holds the effect key exactly once. */
function urlProblems(name: string, t: RawTool, problems: string[]): void {
  const problem = canonicalHttpsProblem(t.endpoint);
  if (problem !== null) problems.push(`/tools/${name}/endpoint ${problem}`);
  if (t.readback !== undefined) {
    const parts = t.readback.url.split(EFFECT_KEY_PLACEHOLDER);
    const p =
      parts.length !== 2
        ? `must contain ${EFFECT_KEY_PLACEHOLDER} exactly once`
        : canonicalHttpsProblem(parts.join('k'));
    if (p !== null) problems.push(`/tools/${name}/readback/url ${p}`);
  }
  if (t.effects_listing_url !== undefined) {
    const p = canonicalHttpsProblem(t.effects_listing_url);
    if (p !== null) problems.push(`/tools/${name}/effects_listing_url ${p}`);
  }
}

/** A tool's declared inverse: another declared tool, each argument from the original or a literal. */
function compensationMapping(
  name: string,
  raw: NonNullable<RawTool['compensation']>,
  routes: RawConfig['tools'],
  problems: string[],
): CompensationMapping {
  const where = `/tools/${name}/compensation`;
  if (routes[raw.tool] === undefined)
    problems.push(`${where}/tool names ${JSON.stringify(raw.tool)}, which /tools does not declare`);
  else if (raw.tool === name) problems.push(`${where}/tool must be another tool`);
  const args: Record<string, CompensationSource> = {};
  for (const [arg, src] of Object.entries(raw.arguments)) {
    if ('value' in src) args[arg] = Object.freeze({ value: src.value });
    else if (src.from === 'arguments') {
      if (src.pointer === undefined)
        problems.push(`${where}/arguments/${arg} needs a pointer into the original arguments`);
      args[arg] = Object.freeze({ from: 'arguments', pointer: src.pointer ?? '' });
    } else {
      if (src.pointer !== undefined)
        problems.push(`${where}/arguments/${arg} takes a pointer only with from: arguments`);
      args[arg] = Object.freeze({ from: src.from });
    }
  }
  return Object.freeze({ tool: raw.tool, arguments: Object.freeze(args) });
}
