/**
 * `/metrics` during a rollout: scraped in a loop from the moment `actionledger start` is spawned, while its two
 * dispatcher workers start, no scrape fails once `/readyz` has said 200. A worker still starting has not yet
 * installed the listener that answers the parent's metrics request; the scrape answers without it (the
 * parent's metrics and the workers that answered, `actionledger_scrape_workers_missing` counting the rest)
 * instead of waiting for it and failing. Once both workers run, a scrape holds both workers' series. The scrape
 * reaches a worker (every worker serves the API), which asks the parent for the fleet's exposition.
 */
import t from 'tap';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startDispatchKit } from '../../sandbox/kit.js';
import { BIN } from '../helpers/cli.js';
import { createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { PROVIDER_TOKEN, spawnService } from '../helpers/fleet.js';
import { freePort } from '../helpers/net.js';

/** Status of a GET, or 0 when the connection failed (not listening yet). */
async function status(url: string): Promise<{ status: number; text: string }> {
  try {
    const res = await fetch(url);
    return { status: res.status, text: await res.text() };
  } catch {
    return { status: 0, text: '' };
  }
}

t.test('no failed /metrics scrape after /readyz turns 200, while the workers start', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-rollout-'));
  chmodSync(dir, 0o711);
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const kit = await startDispatchKit({ dir, token: PROVIDER_TOKEN, profile: { profile_id: 'test' } });
  t.teardown(() => kit.stop());
  const url = await createTestDatabase(t);
  const port = await freePort();
  writeFileSync(
    join(dir, 'config.json'),
    JSON.stringify({
      http: { host: '127.0.0.1', port },
      dispatcher: { ...kit.dispatcherConfig, poll_interval_ms: 200, heartbeat_interval_ms: 500 },
      tools: {
        issue_refund: {
          provider_id: 'billing-test',
          endpoint: kit.provider.endpoint,
          allowed_tenants: ['tenant-a'],
          credential_env: 'TEST_BILLING_TOKEN',
          idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
          readback: { url: `${kit.provider.endpoint}/by-key/{effect_key}` },
        },
      },
    }),
  );
  const service = spawnService(BIN, ['--workers', '2'], {
    ACTIONLEDGER_CONFIG: join(dir, 'config.json'),
    ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
    DATABASE_URL: url,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
    TEST_BILLING_TOKEN: PROVIDER_TOKEN,
    LOG_LEVEL: 'info',
  });
  t.teardown(() => service.killGroup());

  const base = `http://127.0.0.1:${port}`;
  let ready = false;
  const after: { status: number; missing: number | null }[] = [];
  const running = () => (service.stdout().match(/dispatcher running/g) ?? []).length;
  // Until both workers run, then a few scrapes more; bounded.
  const deadline = Date.now() + 90_000;
  let settled = 0;
  while (settled < 3 && Date.now() < deadline) {
    if (!ready) ready = (await status(`${base}/readyz`)).status === 200;
    if (ready) {
      const m = await status(`${base}/metrics`);
      const missing = /^actionledger_scrape_workers_missing(?:\{[^}]*\})? (\d+)$/m.exec(m.text);
      after.push({ status: m.status, missing: missing === null ? null : Number(missing[1]) });
      if (running() === 2) settled++;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  t.equal(running(), 2, 'both workers started');
  // The workers serve `/readyz` themselves: it answers once the first of them listens, which may be just before
  // both run, so the scrapes after it may be only the three taken once both run.
  t.ok(after.length >= 3, `${after.length} scrapes after readyz said 200`);
  t.same(
    after.filter((s) => s.status !== 200),
    [],
    'every scrape after readyz 200 answered 200',
  );
  t.ok(
    after.every((s) => s.missing !== null),
    'each scrape says how many workers it lacks',
  );
  const last = await status(`${base}/metrics`);
  t.match(last.text, /actionledger_scrape_workers_missing(\{[^}]*\})? 0$/m, 'once they run, none is missing');
  t.match(last.text, /\{[^}]*worker="1"[^}]*\}/, "worker 1's series");
  t.match(last.text, /\{[^}]*worker="2"[^}]*\}/, "worker 2's series");
  t.comment(`scrapes lacking a starting worker: ${after.filter((s) => (s.missing ?? 0) > 0).length}`);
});
