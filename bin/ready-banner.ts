/**
 * What `actionledger start` prints once it serves, for a person at a terminal: where the API, the console and
 * MCP are, and the commands a newcomer runs first (a person with a role, and a one-time sign-in link to the
 * console for them). Not at a terminal, nothing is printed: the log's `actionledger listening` line is there.
 */
import type { Config } from '../config/index.js';

/** The listener's base URL as a browser or a client reaches it (a wildcard address is reached on localhost). */
export function baseUrl(config: Config, port: number): string {
  const { host, tls } = config.http;
  const reachable = host === '0.0.0.0' || host === '::' || host === '' ? 'localhost' : host;
  const shown = reachable.includes(':') ? `[${reachable}]` : reachable;
  return `${tls === null ? 'http' : 'https'}://${shown}:${port}`;
}

/** A tenant the configuration names (the first tool's first allowed tenant), for the example commands. */
function exampleTenant(config: Config): string {
  for (const tool of config.tools.values()) for (const tenant of tool.allowedTenants) return tenant;
  return 'TENANT';
}

/** A role that may read and work the review queue in the console, as the configuration grants them. */
function exampleRole(config: Config): string {
  const p = config.api.permissions;
  for (const role of p.review) if (p.read.has(role)) return role;
  for (const role of p.read) return role;
  return 'ROLE';
}

/** The lines printed at a terminal once the service is ready (each ends with a newline). */
export function readyBanner(config: Config, port: number): string {
  const base = baseUrl(config, port);
  const tenant = exampleTenant(config);
  const role = exampleRole(config);
  const glass = '--break-glass admin';
  return [
    '',
    `actionledger is ready on ${base}`,
    `  API      ${base}/v1/  (OpenAPI document: ${base}/v1/openapi.json)`,
    `  console  ${base}/console`,
    `  MCP      ${base}/mcp`,
    '',
    'Next, in another terminal: a person with a role, and a one-time sign-in link to the console for them',
    `  npx actionledger principal add alice --kind person ${glass}`,
    `  npx actionledger principal grant alice --tenant ${tenant} --role ${role} ${glass}`,
    `  npx actionledger principal login-link alice ${glass}`,
    "Open the link's url in a browser. An API token for a principal:",
    `  npx actionledger token create alice --tenant ${tenant} ${glass}`,
    'Stop with Ctrl-C. More: npx actionledger help',
    '',
  ].join('\n');
}
