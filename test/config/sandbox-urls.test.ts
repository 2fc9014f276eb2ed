/**
 * One setting per port: the shipped configuration's tools are written as paths of the sandbox provider and
 * follow `sandbox.provider_port`; a full URL on this machine that contradicts it is refused with its field named
 * (`config_invalid`), while a path with the sandbox off is refused too. Through the real `actionledger start`
 * as well: the operator reads the fields on stderr, and nothing is started.
 */
import t, { type Test } from 'tap';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { compileConfig, type Config } from '../../config/index.js';
import { isActionLedgerError } from '../../core/errors.js';
import type { ConfigProblem } from '../../core/config-problems.js';
import { lastJson, runCli } from '../helpers/cli.js';
import { EXIT } from '../../bin/cli-util.js';

const SHIPPED = join(import.meta.dirname, '..', '..', '..', 'actionledger.config.json');

/** The shipped configuration as parsed JSON, `edit` applied to it. */
function shipped(edit: (c: Record<string, Record<string, unknown>>) => void = () => undefined): unknown {
  const c = JSON.parse(readFileSync(SHIPPED, 'utf8')) as Record<string, Record<string, unknown>>;
  edit(c);
  return c;
}

type Tools = Record<string, { endpoint: string; readback: { url: string }; effects_listing_url: string }>;

/** Writes every URL of the shipped tools as `https://<host><path>` (host with its port). */
function absolute(host: string): (c: Record<string, Record<string, unknown>>) => void {
  return (c) => {
    for (const tool of Object.values(c.tools as Tools)) {
      tool.endpoint = `https://${host}${tool.endpoint}`;
      tool.readback.url = `https://${host}${tool.readback.url}`;
      tool.effects_listing_url = `https://${host}${tool.effects_listing_url}`;
    }
  };
}

function urlsOf(cfg: Config): string[] {
  return [...cfg.tools.values()].flatMap((r) => [r.endpoint, r.readback?.urlTemplate ?? '', r.effectsListingUrl ?? '']);
}

/** The issues of the `config_invalid` the input is refused with (fails the test when it compiles). */
function issuesOf(t: Test, input: unknown): ConfigProblem[] {
  try {
    compileConfig(input, {});
  } catch (err) {
    t.ok(isActionLedgerError(err) && err.code === 'config_invalid', 'config_invalid');
    return (err as { details: { issues: ConfigProblem[] } }).details.issues;
  }
  t.fail('the configuration compiled');
  return [];
}

const FIELDS = [
  '/tools/issue_refund/endpoint',
  '/tools/issue_refund/readback/url',
  '/tools/issue_refund/effects_listing_url',
  '/tools/void_refund/endpoint',
  '/tools/void_refund/readback/url',
  '/tools/void_refund/effects_listing_url',
];

t.test('the shipped tools follow sandbox.provider_port: every URL at the port set, and nothing else moves', (t) => {
  const at7443 = urlsOf(compileConfig(shipped(), {}));
  t.same(at7443, [
    'https://localhost:7443/v1/refunds',
    'https://localhost:7443/v1/refunds/by-key/{effect_key}',
    'https://localhost:7443/v1/effects',
    'https://localhost:7443/v1/refund_voids',
    'https://localhost:7443/v1/refund_voids/by-key/{effect_key}',
    'https://localhost:7443/v1/effects',
  ]);
  const moved = compileConfig(
    shipped((c) => (c.sandbox = { enabled: true, provider_port: 17543, authorizer_port: 17544 })),
    {},
  );
  t.same(
    urlsOf(moved),
    at7443.map((u) => u.replace(':7443/', ':17543/')),
    'one setting moved all six',
  );
  t.equal(moved.sandbox.providerPort, 17543);
  const at443 = compileConfig(
    shipped((c) => ((c.sandbox as { provider_port: number }).provider_port = 443)),
    {},
  );
  t.equal(at443.tools.get('issue_refund')?.endpoint, 'https://localhost/v1/refunds', 'port 443: canonical, no port');
  t.end();
});

t.test('a full URL on this machine at another port than the sandbox provider: refused, each field named', (t) => {
  for (const host of ['localhost:7443', '127.0.0.1:7443', '[::1]:7443', 'localhost:7444', 'localhost']) {
    const issues = issuesOf(
      t,
      shipped((c) => {
        absolute(host)(c);
        c.sandbox = { enabled: true, provider_port: 17543, authorizer_port: 17544 };
      }),
    );
    t.same(
      issues.map((i) => i.path),
      FIELDS,
      `${host}: the six fields, and nothing else`,
    );
    t.match(
      issues[0],
      {
        message:
          /^points at port \d+ on this machine, but the sandbox provider listens on \/sandbox\/provider_port \(17543\)/,
        got: `https://${host}/v1/refunds`,
        suggestion: '/v1/refunds',
      },
      `${host}: the port found, the port expected, the path to write instead`,
    );
    t.match(issues[1], { suggestion: '/v1/refunds/by-key/{effect_key}' });
  }
  t.end();
});

t.test('full URLs the sandbox does not contradict are kept as written', (t) => {
  const ok = (label: string, edit: (c: Record<string, Record<string, unknown>>) => void, expected: string) =>
    t.equal(compileConfig(shipped(edit), {}).tools.get('issue_refund')?.endpoint, expected, label);
  ok('at the sandbox provider port', absolute('localhost:7443'), 'https://localhost:7443/v1/refunds');
  ok('another machine', absolute('billing.example.org'), 'https://billing.example.org/v1/refunds');
  ok(
    'the sandbox off',
    (c) => {
      absolute('localhost:9443')(c);
      c.sandbox = { enabled: false };
    },
    'https://localhost:9443/v1/refunds',
  );
  ok(
    'dispatcher.tls set: the operator brought other certificates, which another local server may hold',
    (c) => {
      absolute('localhost:9443')(c);
      c.dispatcher = { ...c.dispatcher, tls: { ca_file: 'ca.crt', cert_file: 'c.crt', key_file: 'c.key' } };
    },
    'https://localhost:9443/v1/refunds',
  );
  t.end();
});

t.test('a path with the sandbox off: refused, each field named; a path still gets the URL checks', (t) => {
  const off = issuesOf(
    t,
    shipped((c) => (c.sandbox = { enabled: false })),
  );
  t.same(
    off.map((i) => i.path),
    FIELDS,
  );
  t.match(off[0], {
    message: /^is a path, .*\/sandbox\/enabled is not true: write a full https URL$/,
    got: '/v1/refunds',
  });
  const bad = issuesOf(
    t,
    shipped((c) => {
      const tool = (c.tools as Tools).issue_refund!;
      tool.endpoint = '/v1/../refunds';
      tool.readback.url = '/v1/refunds/by-key';
    }),
  );
  t.match(bad, [
    { path: '/tools/issue_refund/endpoint', message: /^is not in canonical form/ },
    { path: '/tools/issue_refund/readback/url', message: 'must contain {effect_key} exactly once' },
  ]);
  t.end();
});

t.test(
  'actionledger start on a contradicting configuration: refused before anything starts, the fields named',
  async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'al-ports-'));
    const path = join(dir, 'config.json');
    writeFileSync(
      path,
      JSON.stringify(
        shipped((c) => {
          absolute('localhost:7443')(c);
          (c.sandbox as { provider_port: number }).provider_port = 17543;
        }),
      ),
    );
    const r = await runCli(['start', '--workers', '0'], {
      ACTIONLEDGER_CONFIG: path,
      ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
    });
    t.equal(r.code, EXIT.refused, r.stderr);
    t.match(
      r.stderr,
      /\n {2}tools\.issue_refund\.endpoint: points at port 7443 on this machine, but the sandbox provider listens on \/sandbox\/provider_port \(17543\).* \(got "https:\/\/localhost:7443\/v1\/refunds"; did you mean "\/v1\/refunds"\?\)\n/,
    );
    const refusal = lastJson(r.stdout) as { error: string; details: { issues: { path: string }[] } };
    t.equal(refusal.error, 'config_invalid');
    t.same(
      refusal.details.issues.map((i) => i.path),
      FIELDS,
    );
  },
);
