/**
 * Notification destinations refuse internal targets. At configuration load: a table of webhook `url`s and Slack
 * `api_base_url`s (every refused class, the decimal, hex, octal and short IPv4 forms Node's URL parser
 * normalizes, IPv6 in brackets, IPv4-mapped IPv6, upper case, a trailing dot, percent-encoding) each reported
 * at its JSON pointer with the class named, all accepted with `allow_private_network: true`; userinfo refused
 * either way, without echoing the credential. At delivery: a name the load check cannot know, resolved to
 * loopback (a test-only name given to the delivery's resolver), fails each attempt before any connection,
 * recorded as `not_sent:private_network:loopback`, while with `allow_private_network` the same name is
 * delivered to the real local HTTPS receiver. And the start-up warning for an allowed destination.
 */
import { randomBytes } from 'node:crypto';
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { createServer } from 'node:https';
import type { LookupFunction } from 'node:net';
import t, { type Test } from 'tap';
import { compileConfig } from '../../config/index.js';
import type { ConfigProblem } from '../../core/config-problems.js';
import { isActionLedgerError } from '../../core/errors.js';
import { createLogger } from '../../core/log.js';
import { AuditWriter } from '../../gate/index.js';
import { checkDestinations, NotificationDelivery } from '../../notifier/index.js';
import { issueServerCert } from '../../sandbox/pki.js';
import { auditRows, count, gateFixture, gctx, type GateFixture } from '../helpers/gate.js';
import { receiverPki } from '../helpers/notify-receivers.js';

const tools = {
  issue_refund: {
    provider_id: 'billing',
    endpoint: 'https://billing.example.org/v3/refunds',
    allowed_tenants: ['tenant-a'],
    idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
  },
};

/** Each URL and the words its refusal must name. */
const REFUSED: [string, string][] = [
  ['https://169.254.169.254/latest/meta-data/', 'a cloud metadata service address (169.254.169.254/32)'],
  ['https://168.63.129.16/machine?comp=goalstate', 'a cloud metadata service address (168.63.129.16/32)'],
  ['https://169.254.1.1/', 'a link-local address (169.254.0.0/16)'],
  ['https://127.0.0.1:5432/', 'a loopback address (127.0.0.0/8)'],
  ['https://127.53.0.9/', 'a loopback address'],
  ['https://2130706433/', 'a loopback address'], // decimal
  ['https://0x7f000001/', 'a loopback address'], // hex
  ['https://0x7f.1/', 'a loopback address'],
  ['https://0177.0.0.1/', 'a loopback address'], // octal
  ['https://127.1/', 'a loopback address'], // short
  ['https://[::1]/', 'a loopback address (::1/128)'],
  ['https://[0:0:0:0:0:0:0:1]:8443/x', 'a loopback address'],
  ['https://[::ffff:127.0.0.1]/', 'a loopback address (IPv4-mapped 127.0.0.1'],
  ['https://[::ffff:7f00:1]/', 'a loopback address (IPv4-mapped 127.0.0.1'],
  ['https://[::ffff:169.254.169.254]/', 'a cloud metadata service address (IPv4-mapped 169.254.169.254'],
  ['https://[::ffff:10.1.2.3]/', 'a private address (IPv4-mapped 10.1.2.3'],
  ['https://[::ffff:100.64.0.1]/', 'a carrier-grade NAT address (IPv4-mapped'],
  ['https://[::ffff:0.0.0.0]/', 'an unspecified address (IPv4-mapped'],
  ['https://[64:ff9b::a9fe:a9fe]/', 'a cloud metadata service address (NAT64 169.254.169.254'],
  ['https://localhost/', 'a loopback name'],
  ['https://LOCALHOST./', 'a loopback name'],
  ['https://localhost:8443/', 'a loopback name'],
  ['https://hooks.LocalHost/', 'a loopback name'],
  ['https://%6C%6F%63%61%6C%68%6F%73%74/', 'a loopback name'],
  ['https://metadata.google.internal/computeMetadata/v1/', 'a cloud metadata service name'],
  ['https://METADATA.GOOGLE.INTERNAL./', 'a cloud metadata service name'],
  ['https://metadata/', 'a cloud metadata service name'],
  ['https://instance-data/latest/', 'a cloud metadata service name'],
  ['https://billing.internal/', 'an internal name (under .internal'],
  ['https://printer.local/', 'an internal name (under .local'],
  ['https://nas.home.arpa/', 'an internal name (under .home.arpa'],
  ['https://intranet/', 'an internal name (a single label'],
  ['https://10.0.0.1/', 'a private address (10.0.0.0/8)'],
  ['https://172.16.5.4/', 'a private address (172.16.0.0/12)'],
  ['https://172.31.255.254/', 'a private address (172.16.0.0/12)'],
  ['https://192.168.1.1/', 'a private address (192.168.0.0/16)'],
  ['https://[fd00:ec2::254]/', 'a cloud metadata service address (fd00:ec2::254/128)'],
  ['https://[fd00:ec2::1]/', 'a private address (fc00::/7)'],
  ['https://[FC00::1]/', 'a private address (fc00::/7)'],
  ['https://[fe80::1]/', 'a link-local address (fe80::/10)'],
  ['https://0.0.0.0/', 'an unspecified address (0.0.0.0/8)'],
  ['https://0/', 'an unspecified address'],
  ['https://[::]/', 'an unspecified address (::/128)'],
  ['https://100.64.0.1/', 'a carrier-grade NAT address (100.64.0.0/10)'],
  ['https://100.127.255.254/', 'a carrier-grade NAT address'],
  ['https://224.0.0.251/', 'a multicast address (224.0.0.0/4)'],
  ['https://[ff02::1]/', 'a multicast address (ff00::/8)'],
  ['https://255.255.255.255/', 'the broadcast address'],
  ['https://4294967295/', 'the broadcast address'],
  ['https://240.0.0.1/', 'a reserved address (240.0.0.0/4)'],
  ['https://192.0.2.10/', 'a reserved address (192.0.2.0/24)'],
  ['https://[2001:db8::1]/', 'a reserved address (2001:db8::/32)'],
];

const ACCEPTED = [
  'https://hooks.example.com/actionledger',
  'https://hooks.example.com/@team',
  'https://8.8.8.8/',
  'https://172.32.0.1/',
  'https://100.128.0.1/',
  'https://[2606:4700:4700::1111]/',
  'https://[::ffff:8.8.8.8]/',
  'https://localhost.example.com/',
];

const USERINFO = [
  'https://user:hunter2@hooks.example.com/',
  'https://user@hooks.example.com/',
  'https://:hunter2@hooks.example.com/',
  'https://@hooks.example.com/',
  'https://user:hunter2@127.0.0.1/',
];

/** A webhook and a Slack destination per URL; `allow` sets allow_private_network on each. */
function destinations(urls: readonly string[], allow: boolean | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const flag = allow === undefined ? {} : { allow_private_network: allow };
  urls.forEach((url, i) => {
    out[`w${i}`] = { type: 'webhook', url, secret_envs: ['WH'], ...flag };
    out[`s${i}`] = {
      type: 'slack',
      channel: 'C1',
      team_id: 'T1',
      bot_token_env: 'B',
      signing_secret_env: 'S',
      api_base_url: url,
      ...flag,
    };
  });
  return out;
}

function problems(urls: readonly string[], allow: boolean | undefined): { issues: ConfigProblem[]; text: string } {
  try {
    compileConfig({ tools, notifications: { destinations: destinations(urls, allow) } }, {});
  } catch (err) {
    if (isActionLedgerError(err, 'config_invalid'))
      return { issues: err.details?.issues as ConfigProblem[], text: `${err.message} ${JSON.stringify(err.details)}` };
    throw err;
  }
  return { issues: [], text: '' };
}

t.test('at load, each internal target is refused at its path, its class named', (t) => {
  for (const allow of [undefined, false]) {
    const { issues } = problems(
      REFUSED.map(([url]) => url),
      allow,
    );
    REFUSED.forEach(([url, words], i) => {
      for (const [path, label] of [
        [`/notifications/destinations/w${i}/url`, 'webhook url'],
        [`/notifications/destinations/s${i}/api_base_url`, 'Slack api_base_url'],
      ] as const) {
        const found = issues.filter((p) => p.path === path);
        t.equal(found.length, 1, `${label} ${url} is refused once (allow_private_network: ${allow})`);
        t.ok(found[0]?.message.includes(words), `${url}: "${found[0]?.message}" names ${words}`);
        t.match(found[0]?.message, /refused unless the destination sets allow_private_network: true/);
        t.equal(found[0]?.got, url, 'the URL is quoted back');
      }
    });
    t.equal(issues.length, REFUSED.length * 2, 'nothing else is reported');
  }
  t.end();
});

t.test('public targets pass; allow_private_network: true lets every internal one through', (t) => {
  t.same(problems(ACCEPTED, undefined).issues, [], 'public names and addresses');
  t.same(
    problems(
      REFUSED.map(([url]) => url),
      true,
    ).issues,
    [],
    'every refused URL, allowed',
  );
  const cfg = compileConfig(
    {
      tools,
      notifications: {
        destinations: {
          inside: {
            type: 'webhook',
            url: 'https://127.0.0.1:8443/x',
            secret_envs: ['WH'],
            allow_private_network: true,
          },
          outside: { type: 'webhook', url: 'https://hooks.example.com/x', secret_envs: ['WH'] },
        },
      },
    },
    {},
  );
  t.equal(cfg.notifications.destinations.get('inside')?.allowPrivateNetwork, true);
  t.equal(cfg.notifications.destinations.get('outside')?.allowPrivateNetwork, false, 'off by default');
  t.end();
});

t.test('userinfo is refused whatever allow_private_network says, and never quoted back', (t) => {
  for (const allow of [undefined, false, true]) {
    const { issues, text } = problems(USERINFO, allow);
    USERINFO.forEach((url, i) => {
      for (const path of [`/notifications/destinations/w${i}/url`, `/notifications/destinations/s${i}/api_base_url`]) {
        const found = issues.filter((p) => p.path === path);
        t.equal(found.length, 1, `${url} at ${path} (allow_private_network: ${allow})`);
        t.match(found[0]?.message, /contains userinfo/);
        t.equal(found[0]?.got, undefined, 'the URL is not quoted back');
      }
    });
    t.equal(issues.length, USERINFO.length * 2, 'only userinfo is reported');
    t.notOk(text.includes('hunter2'), 'the password appears nowhere in the error');
  }
  t.end();
});

// ---- at delivery -------------------------------------------------------------------------------------------

const HOOKS = 'hooks.actionledger.test';
const SLACK = 'slack.actionledger.test';
const WH = `whsec_${randomBytes(32).toString('base64')}`;
const ENV = { WH, SLACK_BOT_TOKEN: 'xoxb-test', SLACK_SIGNING_SECRET: 'signing' };

/** Test-only names on loopback (`.test` never resolves in public DNS); any other name goes to the system. */
function testResolver(): { lookup: LookupFunction; asked: string[] } {
  const asked: string[] = [];
  const lookup: LookupFunction = (hostname, options, callback) => {
    if (hostname !== HOOKS && hostname !== SLACK) return dnsLookup(hostname, options, callback);
    asked.push(hostname);
    const a: LookupAddress = { address: '127.0.0.1', family: 4 };
    if (options.all === true) callback(null, [a]);
    else callback(null, a.address, a.family);
  };
  return { lookup, asked };
}

interface Receiver {
  port: number;
  connections: number;
  requests: { host: string; path: string; webhookId: string | undefined }[];
}

/** A real HTTPS server on loopback with a certificate for both test names: a webhook receiver and Slack's API. */
async function receiver(t: Test): Promise<{ r: Receiver; ca: string }> {
  const pki = await receiverPki();
  const cert = await issueServerCert(pki.ca, { hosts: [HOOKS, SLACK] });
  const r: Receiver = { port: 0, connections: 0, requests: [] };
  const server = createServer({ cert: cert.cert, key: cert.key }, (req, res) => {
    req.resume();
    req.on('end', () => {
      const id = req.headers['webhook-id'];
      r.requests.push({ host: req.headers.host ?? '', path: req.url ?? '', webhookId: Array.isArray(id) ? id[0] : id });
      if (req.url === '/hooks') {
        res.statusCode = 204;
        res.end();
        return;
      }
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ ok: true, channel: 'C1', ts: '1000.000100' }));
    });
  });
  server.on('connection', () => (r.connections += 1));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  r.port = (server.address() as { port: number }).port;
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { r, ca: pki.paths.caCert };
}

async function setup(
  t: Test,
  allow: boolean,
): Promise<{ g: GateFixture; r: Receiver; delivery: NotificationDelivery; asked: string[]; logs: string[] }> {
  const { r, ca } = await receiver(t);
  const flag = allow ? { allow_private_network: true } : {};
  const g = await gateFixture(t, {
    extra: {
      notifications: {
        destinations: {
          hooks: {
            type: 'webhook',
            url: `https://${HOOKS}:${r.port}/hooks`,
            secret_envs: ['WH'],
            ca_file: ca,
            ...flag,
          },
          chat: {
            type: 'slack',
            channel: 'C1',
            team_id: 'T1',
            bot_token_env: 'SLACK_BOT_TOKEN',
            signing_secret_env: 'SLACK_SIGNING_SECRET',
            api_base_url: `https://${SLACK}:${r.port}/api`,
            ca_file: ca,
            ...flag,
          },
        },
        routes: [{ destinations: ['hooks', 'chat'], events: ['approval.requested'] }],
        delivery: { backoff_initial_ms: 10, backoff_max_ms: 20, max_attempts: 2, timeout_ms: 2000, lease_ms: 3000 },
      },
    },
  });
  const logs: string[] = [];
  const log = createLogger({
    level: 'info',
    name: 'private-network-test',
    destination: { write: (s) => logs.push(s) },
  });
  const { lookup, asked } = testResolver();
  const delivery = new NotificationDelivery({
    config: g.config,
    pool: g.pool,
    audit: new AuditWriter({ config: g.config, pool: g.pool, log }),
    log,
    env: ENV,
    lookup,
  });
  t.teardown(() => delivery.stop());
  return { g, r, delivery, asked, logs };
}

async function drain(g: GateFixture, delivery: NotificationDelivery): Promise<void> {
  for (let i = 0; i < 200; i++) {
    await delivery.tick();
    const pending =
      (await count(g.pool, "actionledger.notification_deliveries WHERE status = 'pending'")) +
      (await count(g.pool, 'actionledger.notification_events WHERE fanned_out_at IS NULL'));
    if (pending === 0) return;
    await new Promise((resolve) => setTimeout(resolve, 15));
  }
  throw new Error('deliveries still pending');
}

async function requestApproval(g: GateFixture): Promise<void> {
  const held = await g.gate.call(
    gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: 'pn-1' }),
    'update_document',
    { document_id: 'DOC-1', status: 'published' },
  );
  if (held.ok || held.error !== 'approval_required') throw new Error(JSON.stringify(held));
}

const deliveries = async (g: GateFixture) =>
  (
    await g.pool.query<{ destination: string; status: string; attempts: number; last_error: string | null }>(
      'SELECT destination, status, attempts, last_error FROM actionledger.notification_deliveries ORDER BY destination',
    )
  ).rows;

t.test('a name resolving to loopback at delivery is refused before any connection, attempt by attempt', async (t) => {
  const { g, r, delivery, asked, logs } = await setup(t, false);
  await requestApproval(g);
  await drain(g, delivery);
  t.ok(asked.includes(HOOKS) && asked.includes(SLACK), 'both names were resolved at connect time');
  t.equal(r.connections, 0, 'the receiver saw no connection');
  t.same(r.requests, [], 'and no request');
  t.same(await deliveries(g), [
    {
      destination: 'chat',
      status: 'failed',
      attempts: 2,
      last_error: 'attempts_spent:slack:not_sent:private_network:loopback',
    },
    {
      destination: 'hooks',
      status: 'failed',
      attempts: 2,
      last_error: 'attempts_spent:not_sent:private_network:loopback',
    },
  ]);
  const audited = (await auditRows(g.pool, "action = 'notification'")).map(
    (a) => (a.detail as { destination: string; error?: string }).error,
  );
  t.same(audited.sort(), [
    'attempts_spent:not_sent:private_network:loopback',
    'attempts_spent:slack:not_sent:private_network:loopback',
  ]);
  const refusals = logs
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l.code === 'private_network_refused');
  t.equal(refusals.length, 4, 'each refused attempt is logged (2 destinations x 2 attempts)');
  t.ok(
    refusals.every((l) => l.level === 40),
    'at warn level',
  );
  t.notOk(
    logs.some((l) => l.includes('private_network_allowed')),
    'no allowed destination to announce',
  );
});

t.test('with allow_private_network the same names are delivered to the local receiver', async (t) => {
  const { g, r, delivery, asked } = await setup(t, true);
  await requestApproval(g);
  await drain(g, delivery);
  t.ok(asked.includes(HOOKS) && asked.includes(SLACK), 'resolved by the same resolver');
  t.same(
    (await deliveries(g)).map((d) => [d.destination, d.status, d.last_error]),
    [
      ['chat', 'delivered', null],
      ['hooks', 'delivered', null],
    ],
  );
  t.same(r.requests.map((q) => [q.host, q.path]).sort(), [
    [`${HOOKS}:${r.port}`, '/hooks'],
    [`${SLACK}:${r.port}`, '/api/chat.postMessage'],
  ]);
  t.type(r.requests.find((q) => q.path === '/hooks')?.webhookId, 'string', 'a signed webhook');
});

t.test('an allowed destination is announced once, at warn level, naming it', async (t) => {
  const { g, delivery, logs } = await setup(t, true);
  await delivery.start();
  await delivery.stop();
  const lines = logs
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l.code === 'private_network_allowed');
  t.same(
    lines.map((l) => [l.level, l.destination]).sort(),
    [
      [40, 'chat'],
      [40, 'hooks'],
    ],
    'a standalone dispatcher says it when its delivery loop starts',
  );
  t.match(lines[0]?.msg, /sets allow_private_network/);

  const service: string[] = [];
  const log = createLogger({ level: 'info', name: 'service', destination: { write: (s) => service.push(s) } });
  checkDestinations(g.config.notifications, ENV, log);
  t.equal(
    service.filter((l) => l.includes('"code":"private_network_allowed"')).length,
    2,
    'the service says it once per destination before its workers start',
  );
  checkDestinations(g.config.notifications, ENV);
  t.equal(service.length, 2, 'without a log (the check alone) nothing is said');
});
