/**
 * The README's five-minute tour, run as written: `actionledger start` on the shipped configuration (only its
 * ports moved to free ones), then every `sh` block of the README's tour section in order, in one bash run with
 * `set -euo pipefail` from the repository's root, exactly as a newcomer pastes them into a second terminal. The
 * one change made to the text is the API's port. Afterwards the ledger must hold what the tour says happened.
 */
import t from 'tap';
import { chmodSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, lastJson, runCli } from '../helpers/cli.js';
import { freePort } from '../helpers/net.js';
import { spawnService } from '../helpers/fleet.js';

const ROOT = join(import.meta.dirname, '..', '..', '..');

/** The `sh` blocks of the README section headed `heading`, in order. */
export function shellBlocks(readme: string, heading: string): string[] {
  const start = readme.indexOf(`\n## ${heading}\n`);
  if (start < 0) throw new Error(`README has no section "${heading}"`);
  const end = readme.indexOf('\n## ', start + heading.length + 4);
  const section = readme.slice(start, end < 0 ? undefined : end);
  return [...section.matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map((m) => m[1] ?? '');
}

t.test('the README: its tour runs as written against npm start', async (t) => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const blocks = shellBlocks(readme, 'A five-minute tour');
  t.ok(blocks.length >= 5, `the tour has its command blocks (${blocks.length})`);
  t.match(shellBlocks(readme, 'The two commands').join(''), /npm start[\s\S]*npm run check/, 'the two commands');

  const dir = mkdtempSync(join(tmpdir(), 'al-readme-'));
  chmodSync(dir, 0o711);
  const [http, pg, provider, authorizer] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const cfg = JSON.parse(readFileSync(join(ROOT, 'actionledger.config.json'), 'utf8')) as Record<
    string,
    Record<string, unknown>
  >;
  cfg.http = { ...cfg.http, port: http };
  cfg.database = { ...cfg.database, embedded_port: pg };
  cfg.sandbox = { ...cfg.sandbox, provider_port: provider, authorizer_port: authorizer };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  const env = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    ACTIONLEDGER_CONFIG: join(dir, 'config.json'),
    ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
  };

  const service = spawnService(BIN, [], env);
  t.teardown(() => service.killGroup());
  await service.waitFor(/dispatcher running[\s\S]*dispatcher running/);

  const script = ['set -euo pipefail', ...blocks].join('\n').replaceAll(':7420', `:${http}`);
  t.notMatch(script, /7420/, 'the port was the one thing changed');
  const tour = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) =>
    execFile('bash', ['-c', script], { cwd: ROOT, env, timeout: 240_000 }, (err, stdout, stderr) =>
      resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, stdout, stderr }),
    ),
  );
  t.equal(tour.code, 0, `every command of the tour ran:\n${tour.stdout}\n${tour.stderr}`);
  t.match(tour.stdout, /"status":"succeeded"/, 'the first refund was seen succeeded');
  t.match(tour.stdout, /"message":"approved and reserved"/, 'the held refund was approved and reserved');
  t.match(tour.stdout, /\{"ok":true,"status":"reserved".*"operation_uri":"actionledger:\/\/operations\//, 'MCP');
  t.match(tour.stdout, /console\/login\?link=/, 'a sign-in link');
  t.match(tour.stdout, /no discrepancies/, 'verify found nothing wrong');

  // Every refund the tour made reaches the provider once, and nothing is left waiting or in review.
  const until = Date.now() + 60_000;
  let status: Record<string, unknown> = {};
  while (Date.now() < until) {
    status = lastJson((await runCli(['status', '--json'], env)).stdout);
    if ((status.by_status as Record<string, number> | undefined)?.succeeded === 3) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  t.match(status, { by_status: { succeeded: 3, needs_review: 0, pending: 0, executing: 0, unknown: 0 } });

  process.kill(service.pid, 'SIGTERM');
  t.match(await service.exited, { code: 0 }, 'SIGTERM: exit 0');
});
