/**
 * What `actionledger start` writes, from a real child process on the shipped example configuration (the
 * sandbox, one dispatcher worker, a PostgreSQL test database): for a person at a terminal (forced with
 * ACTIONLEDGER_TERMINAL=1, as the child's stdout is a pipe here), log lines a person reads, from the parent and
 * the worker alike, and once ready where the API, console and MCP are and the commands to run next, which are
 * then run as printed, and their sign-in link used; elsewhere (ACTIONLEDGER_TERMINAL=0), JSON lines only.
 */
import t from 'tap';
import { chmodSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, lastJson, runCli } from '../helpers/cli.js';
import { createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { spawnService, type ServiceProcess } from '../helpers/fleet.js';
import { freePort } from '../helpers/net.js';

t.test('start at a terminal says where to go; elsewhere it writes JSON alone', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-start-tty-'));
  chmodSync(dir, 0o711);
  const [http, provider, authorizer] = [await freePort(), await freePort(), await freePort()];
  const example = readFileSync(join(import.meta.dirname, '..', '..', '..', 'actionledger.config.json'), 'utf8');
  const cfg = JSON.parse(example.replaceAll(':7443/', `:${provider}/`)) as Record<string, unknown>;
  cfg.http = { host: '127.0.0.1', port: http };
  cfg.sandbox = { enabled: true, provider_port: provider, authorizer_port: authorizer };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  const env = {
    DATABASE_URL: await createTestDatabase(t),
    ACTIONLEDGER_CONFIG: join(dir, 'config.json'),
    ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
  };
  let service: ServiceProcess | undefined;
  t.teardown(() => {
    if (service !== undefined) process.kill(service.pid, 'SIGKILL');
  });
  const stop = async (s: ServiceProcess) => {
    process.kill(s.pid, 'SIGTERM');
    t.match(await s.exited, { code: 0 }, 'SIGTERM: exit 0');
    service = undefined;
  };
  const base = `http://127.0.0.1:${http}`;

  await t.test('at a terminal', async (t) => {
    const s = (service = spawnService(BIN, ['--workers', '1'], { ...env, ACTIONLEDGER_TERMINAL: '1' }));
    await s.waitFor(/Stop with Ctrl-C/);
    const out = s.stdout();
    const banner = out.slice(out.indexOf('\nactionledger is ready on') + 1);
    t.equal(
      banner.slice(0, banner.indexOf('Stop with Ctrl-C')),
      [
        `actionledger is ready on ${base}`,
        `  API      ${base}/v1/  (OpenAPI document: ${base}/v1/openapi.json)`,
        `  console  ${base}/console`,
        `  MCP      ${base}/mcp`,
        '',
        'Next, in another terminal: a person with a role, and a one-time sign-in link to the console for them',
        '  npx actionledger principal add alice --kind person --break-glass admin',
        '  npx actionledger principal grant alice --tenant tenant-a --role operator --break-glass admin',
        '  npx actionledger principal login-link alice --break-glass admin',
        "Open the link's url in a browser. An API token for a principal:",
        '  npx actionledger token create alice --tenant tenant-a --break-glass admin',
        '',
      ].join('\n'),
      'the lines a newcomer reads, with the configured port, tenant and role',
    );
    const logLines = out.slice(0, out.indexOf('\nactionledger is ready on')).split('\n').filter(Boolean);
    t.notOk(
      logLines.some((l) => l.startsWith('{')),
      'no JSON line before it',
    );
    t.ok(
      logLines.some((l) => /^\d\d:\d\d:\d\d\.\d{3} INFO {2}service: actionledger listening {2}.*port=\d+/.test(l)),
      "the parent's log line, for a person",
    );
    // The worker serves before its dispatcher runs: its line may come after the banner.
    await s.waitFor(/dispatcher: dispatcher running/);
    t.match(
      s.stdout(),
      /\n\d\d:\d\d:\d\d\.\d{3} INFO {2}dispatcher: dispatcher running {2}/,
      "the worker's, for a person",
    );

    // The next commands, run as printed: the last prints the sign-in link.
    const commands = [...banner.matchAll(/^ {2}npx actionledger (.+)$/gm)].map((m) => (m[1] ?? '').split(' '));
    t.equal(commands.length, 4);
    let link = '';
    for (const args of commands) {
      const r = await runCli(args, env);
      t.equal(r.code, 0, `${args.slice(0, 2).join(' ')}: ${r.stderr}`);
      if (args[1] === 'login-link') link = String(lastJson(r.stdout).url);
    }
    t.match(link, `${base}/console/login?link=`, 'a sign-in link on the printed console');

    // `/` leads to the console; the link signs alice in there.
    const root = await fetch(`${base}/`, { redirect: 'manual' });
    t.equal(root.status, 302);
    t.equal(root.headers.get('location'), '/console');
    t.equal((await fetch(link)).status, 200, 'the link opens');
    const signIn = await fetch(`${base}/console/login`, {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: `link=${encodeURIComponent(new URL(link).searchParams.get('link') ?? '')}`,
    });
    t.equal(signIn.status, 303, 'signed in');
    t.equal(signIn.headers.get('location'), '/console/', 'to the console, which opens on the page the roles allow');

    await stop(s);
    t.match(s.stdout(), /\n\d\d:\d\d:\d\d\.\d{3} INFO {2}service: actionledger stopped: /, 'the last line too');
    t.notOk(/^\{/m.test(s.stdout()), 'no JSON line at all');
  });

  await t.test('not at a terminal', async (t) => {
    const s = (service = spawnService(BIN, ['--workers', '1'], { ...env, ACTIONLEDGER_TERMINAL: '0' }));
    await s.waitFor(/actionledger listening/);
    await s.waitFor(/dispatcher running/);
    await stop(s);
    const lines = s.stdout().split('\n').filter(Boolean);
    t.same(
      lines.filter((l) => !l.startsWith('{')),
      [],
      'every line is JSON',
    );
    const parsed = s.lines();
    t.equal(parsed.length, lines.length);
    t.ok(parsed.some((l) => l.name === 'service' && l.msg === 'actionledger listening' && l.port === http));
    t.ok(
      parsed.some((l) => l.name === 'dispatcher' && l.msg === 'dispatcher running'),
      "the worker's too",
    );
    t.notOk(s.stdout().includes('actionledger is ready'), 'nothing for a person');
    t.notOk(s.stdout().includes('npx actionledger'));
  });
});
