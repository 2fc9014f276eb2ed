/**
 * The `notifications` section: every mistake reported at start with its path, all at once; a sound section
 * compiles into frozen destinations and routes; routing by event, tenant and tool.
 */
import t from 'tap';
import { compileConfig } from '../../config/index.js';
import { isActionLedgerError } from '../../core/errors.js';
import type { ConfigProblem } from '../../core/config-problems.js';
import { routeMatches } from '../../notifier/index.js';

const tools = {
  issue_refund: {
    provider_id: 'billing',
    endpoint: 'https://billing.example.org/v3/refunds',
    allowed_tenants: ['tenant-a'],
    idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
  },
};

function problems(notifications: unknown): ConfigProblem[] {
  try {
    compileConfig({ tools, notifications }, {});
  } catch (err) {
    if (isActionLedgerError(err, 'config_invalid')) return err.details?.issues as ConfigProblem[];
    throw err;
  }
  throw new Error('compiled');
}

t.test('mistakes are reported together, each at its path', (t) => {
  const found = problems({
    destinations: {
      plain: { type: 'webhook', url: 'http://hooks.example.org/x', secret_envs: ['WH'] },
      nosecret: { type: 'webhook', url: 'https://hooks.example.org/x', secret_envs: [] },
      halfmtls: { type: 'webhook', url: 'https://hooks.example.org/x', secret_envs: ['WH'], cert_file: 'c.pem' },
      slack: { type: 'slack', channel: 'C1', team_id: 'T1', bot_token_env: 'lower-case', signing_secret_env: 'S' },
    },
    routes: [{ destinations: ['nowhere'], tools: ['no_such_tool'] }],
    delivery: { timeout_ms: 5000, lease_ms: 4000, backoff_initial_ms: 100, backoff_max_ms: 50 },
  });
  const paths = found.map((p) => p.path);
  for (const p of [
    '/notifications/destinations/plain',
    '/notifications/destinations/nosecret',
    '/notifications/destinations/slack',
    '/notifications/destinations/halfmtls',
    '/notifications/routes/0/destinations',
    '/notifications/routes/0/tools',
    '/notifications/delivery/lease_ms',
    '/notifications/delivery/backoff_max_ms',
  ])
    t.ok(
      paths.some((q) => q === p || q.startsWith(`${p}/`)),
      `${p} is reported (${JSON.stringify(paths)})`,
    );
  t.end();
});

t.test('a sound section compiles; routes match by event, tenant and tool', (t) => {
  const cfg = compileConfig(
    {
      tools,
      notifications: {
        destinations: {
          hooks: { type: 'webhook', url: 'https://hooks.example.org/x', secret_envs: ['WH_NEW', 'WH_OLD'] },
          chat: { type: 'slack', channel: 'C1', team_id: 'T1', bot_token_env: 'B', signing_secret_env: 'S' },
        },
        routes: [
          { destinations: ['chat'], events: ['approval.requested'], tenants: ['tenant-a'], tools: ['issue_refund'] },
        ],
      },
    },
    {},
  );
  const chat = cfg.notifications.destinations.get('chat');
  t.equal(chat?.type === 'slack' ? chat.apiBaseUrl : null, 'https://slack.com/api', "Slack's API by default");
  t.ok(Object.isFrozen(cfg.notifications) && Object.isFrozen(chat));
  const r = cfg.notifications.routes[0];
  if (r === undefined) throw new Error('no route');
  t.ok(routeMatches(r, 'approval.requested', 'tenant-a', 'issue_refund'));
  t.notOk(routeMatches(r, 'approval.decided', 'tenant-a', 'issue_refund'), 'another event');
  t.notOk(routeMatches(r, 'approval.requested', 'tenant-b', 'issue_refund'), 'another tenant');
  t.notOk(routeMatches(r, 'approval.requested', 'tenant-a', 'void_refund'), 'another tool');
  t.ok(routeMatches({ ...r, events: null }, 'kill_switch.engaged', '*', null), 'a switch over every tenant and tool');
  t.end();
});
