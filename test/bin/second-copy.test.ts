/**
 * One setting per port, end to end with real processes: two copies of `actionledger start` on the shipped
 * example configuration run side by side (each its own embedded PostgreSQL and development sandbox over mTLS),
 * each from a copy of it made by the README's `sed` command (its "Configuration" section), which changes
 * only its four port settings, and with a data folder of its own. A refund dispatched through each copy's gate
 * succeeds at that copy's own sandbox provider, and `verify` finds each provider's listing agreeing with its
 * ledger.
 */
import t, { type Test } from 'tap';
import { chmodSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, lastJson, runCli } from '../helpers/cli.js';
import { freePort } from '../helpers/net.js';
import { spawnService, type ServiceProcess } from '../helpers/fleet.js';

const SHIPPED = join(import.meta.dirname, '..', '..', '..', 'actionledger.config.json');

type RawConfig = Record<string, Record<string, unknown>>;

/** The port settings the shipped configuration names, each with its value there. */
const PORT_SETTINGS: Record<string, number> = {
  'http.port': 7420,
  'database.embedded_port': 54329,
  'sandbox.provider_port': 7443,
  'sandbox.authorizer_port': 7444,
};

/**
 * The shipped configuration with each port moved to a free one, by the README's `sed` command run for real: its
 * expressions (one a port, `s/": 7420/": 7520/`) with free ports in place of the README's new ones. Each port is
 * written once in the shipped file, so nothing else changes.
 */
async function onFreePorts(t: Test): Promise<RawConfig> {
  const readme = readFileSync(join(import.meta.dirname, '..', '..', '..', 'README.md'), 'utf8');
  const line = readme.split('\n').find((l) => l.startsWith('sed -e \'s/": ')) ?? '';
  const moves = [...line.matchAll(/-e 's\/": (\d+)\/": (\d+)\/'/g)].map((m) => Number(m[1]));
  t.same(moves, Object.values(PORT_SETTINGS), "the README's sed moves each port setting once");
  const args: string[] = [];
  for (const port of moves) args.push('-e', `s/": ${port}/": ${await freePort()}/`);
  const { stdout } = await promisify(execFile)('sed', [...args, SHIPPED]);
  return JSON.parse(stdout) as RawConfig;
}

/** The dotted paths of the leaves where two JSON values differ. */
function differences(a: unknown, b: unknown, at = ''): string[] {
  if (a !== null && b !== null && typeof a === 'object' && typeof b === 'object') {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    return [...keys].flatMap((k) =>
      differences((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], at === '' ? k : `${at}.${k}`),
    );
  }
  return a === b ? [] : [at];
}

interface Copy {
  name: string;
  cfg: RawConfig;
  env: NodeJS.ProcessEnv;
  service: ServiceProcess;
}

/** Starts a copy from `cfg` written to its own file, with a data folder of its own, as a real child process. */
function start(t: Test, dir: string, name: string, cfg: RawConfig): Copy {
  const path = join(dir, `${name}.config.json`);
  writeFileSync(path, JSON.stringify(cfg, null, 2));
  const env = { ACTIONLEDGER_CONFIG: path, ACTIONLEDGER_DATA_DIR: join(dir, `${name}-data`) };
  const service = spawnService(BIN, ['--workers', '1'], env);
  t.teardown(async () => {
    try {
      process.kill(-service.pid, 'SIGKILL');
    } catch {
      // already gone
    }
    await service.exited;
  });
  return { name, cfg, env, service };
}

/** A refund under the approval threshold through the copy's gate; its operation row once it left pending. */
async function refund(t: Test, copy: Copy, task: string): Promise<Record<string, unknown>> {
  const call = await runCli(
    [
      ...['gate', 'call', '--tenant', 'tenant-a', '--principal', 'agent-7', '--role', 'agent', '--account', 'acct-1'],
      ...['--task', task, '--step', '1', '--tool', 'issue_refund'],
      ...['--args', '{"order_id":"o-1","amount":1250,"currency":"EUR"}'],
    ],
    copy.env,
  );
  t.equal(call.code, 0, `${copy.name}: the gate reserved it\n${call.stdout}${call.stderr}`);
  const id = String(lastJson(call.stdout).operation_id);
  let shown: Record<string, unknown> = {};
  for (const until = Date.now() + 60_000; Date.now() < until;) {
    shown = lastJson((await runCli(['show', id, '--json'], copy.env)).stdout);
    const status = (shown.operation as { status?: string } | undefined)?.status;
    if (status !== undefined && status !== 'pending' && status !== 'executing') break;
    await new Promise((r) => setTimeout(r, 200));
  }
  return shown;
}

t.test(
  'a second copy beside the first, only its ports changed: a refund succeeds on each, at its own sandbox',
  async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'al-second-copy-'));
    chmodSync(dir, 0o711);
    const text = readFileSync(SHIPPED, 'utf8');
    const shipped = JSON.parse(text) as RawConfig;
    for (const [setting, port] of Object.entries(PORT_SETTINGS)) {
      const [section, key] = setting.split('.') as [string, string];
      t.equal(shipped[section]?.[key], port, `the shipped config names ${setting}`);
      t.equal(text.split(`": ${port}`).length, 2, `${port} is written there once, as ${setting}`);
    }
    const first = await onFreePorts(t);
    const second = await onFreePorts(t);
    const settings = Object.keys(PORT_SETTINGS).sort();
    t.same(differences(shipped, first).sort(), settings, 'the first copy: the shipped config, other ports');
    t.same(differences(first, second).sort(), settings, 'the two files differ only in the ports');

    const copies = [start(t, dir, 'first', first), start(t, dir, 'second', second)];
    for (const c of copies) await c.service.waitFor(/actionledger listening/, 120_000);
    for (const c of copies) {
      const sandbox = c.cfg.sandbox as { provider_port: number; authorizer_port: number };
      t.ok(
        c.service.lines().some((l) => l.provider === `https://localhost:${sandbox.provider_port}`),
        `${c.name}: its sandbox provider on its own port`,
      );
    }

    for (const c of copies) {
      const shown = await refund(t, c, `refund-${c.name}`);
      t.match(
        shown,
        { ok: true, operation: { status: 'succeeded', provider_receipt: /^op_/ } },
        `${c.name}: dispatched through its sandbox over mTLS`,
      );
    }
    for (const c of copies) {
      const verify = await runCli(['verify', '--json'], c.env);
      t.equal(verify.code, 0, verify.stdout);
      t.match(
        lastJson(verify.stdout),
        { ok: true, operations: 1, listings: 1, provider_effects: 1 },
        `${c.name}: its provider applied its one refund, and only that`,
      );
    }

    for (const c of copies) process.kill(c.service.pid, 'SIGTERM');
    for (const c of copies) t.match(await c.service.exited, { code: 0 }, `${c.name}: SIGTERM, exit 0`);
  },
);
