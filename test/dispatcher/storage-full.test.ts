/**
 * A database that runs out of disk (SQLSTATE 53100) under a running dispatcher, then gets room again: every
 * operation reaches its end without a restart, and no provider request is sent twice for one Idempotency-Key.
 * The full disk is a trigger that raises 53100 on the statements the test names while a flag row exists
 * (deterministic, unlike filling a real file system); real PostgreSQL, the sandbox provider and authorizer
 * over mTLS, a real Dispatcher.
 */
import t from 'tap';
import type { Pool } from '../../db/db.js';
import type { OperationStatus } from '../../core/types.js';
import { historyProblems } from '../../reconciler/index.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';

const args = (n: number) => ({ order_id: `ord-${n}`, amount: 100 + n, currency: 'EUR' });

/** Where the simulated full disk bites, each while `public.disk_full` holds its name. */
type Stage = 'evidence' | 'ledger' | 'claim';

/**
 * evidence: the evidence insert; ledger: any update of an executing operation (outcome, refusal, release);
 * claim: the claim's delete of outbox rows. Each refusal counts on the stage's sequence (sequences are not
 * rolled back with the failed statement).
 */
async function installFullDisk(pool: Pool): Promise<void> {
  await pool.query(`
    CREATE TABLE public.disk_full (stage text PRIMARY KEY);
    CREATE SEQUENCE public.disk_full_hits_evidence;
    CREATE SEQUENCE public.disk_full_hits_ledger;
    CREATE SEQUENCE public.disk_full_hits_claim;
    CREATE FUNCTION public.disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM public.disk_full WHERE stage = TG_ARGV[0]) THEN
        PERFORM nextval(('public.disk_full_hits_' || TG_ARGV[0])::regclass);
        RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
      END IF;
      RETURN coalesce(NEW, OLD);
    END $$;
    CREATE TRIGGER disk_full BEFORE INSERT ON actionledger.authorization_evidence
      FOR EACH ROW EXECUTE FUNCTION public.disk_full('evidence');
    CREATE TRIGGER disk_full BEFORE UPDATE ON actionledger.operations
      FOR EACH ROW WHEN (OLD.status = 'executing') EXECUTE FUNCTION public.disk_full('ledger');
    CREATE TRIGGER disk_full BEFORE DELETE ON actionledger.outbox
      FOR EACH ROW EXECUTE FUNCTION public.disk_full('claim');`);
}

async function fill(pool: Pool, stages: Stage[]): Promise<void> {
  await pool.query('INSERT INTO public.disk_full SELECT unnest($1::text[]) ON CONFLICT DO NOTHING', [stages]);
}

async function hits(pool: Pool, stage: Stage): Promise<number> {
  const { rows } = await pool.query<{ n: string }>(
    `SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS n FROM public.disk_full_hits_${stage}`,
  );
  return Number(rows[0]?.n ?? 0);
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

async function histories(
  pool: Pool,
  ids: string[],
): Promise<
  Map<
    string,
    {
      from_status: OperationStatus | null;
      to_status: OperationStatus;
      reason: string;
      detail: Record<string, unknown> | null;
    }[]
  >
> {
  const { rows } = await pool.query<{
    operation_id: string;
    from_status: OperationStatus | null;
    to_status: OperationStatus;
    reason: string;
    detail: Record<string, unknown> | null;
  }>(
    'SELECT operation_id, from_status, to_status, reason, detail FROM actionledger.operation_history WHERE operation_id = ANY($1) ORDER BY operation_id, id',
    [ids],
  );
  const out = new Map<string, typeof rows>();
  for (const r of rows) (out.get(r.operation_id) ?? out.set(r.operation_id, []).get(r.operation_id))?.push(r);
  return out;
}

t.test(
  'a disk that fills mid-run and is freed again: every operation succeeds without a restart, each sent once',
  async (t) => {
    const e = await dispatchEnv(t);
    await installFullDisk(e.pool);
    const reserved = [];
    for (let i = 0; i < 16; i++) reserved.push(await e.ledger.reserve(ctx(`full-${i}`), 'issue_refund', args(i)));
    // The disk fills while the sixth authorization is answered: that operation's evidence cannot be written,
    // nor can the release of its claim, the outcomes of those already at the provider, or new claims.
    let asked = 0;
    e.authorizer.decide = async (): Promise<'allow'> => {
      if (++asked === 6) await fill(e.pool, ['evidence', 'ledger', 'claim']);
      return 'allow';
    };
    await e.dispatcher(4);
    await until(
      'an evidence write and a release to fail on the full disk',
      async () => (await hits(e.pool, 'evidence')) >= 1 && (await hits(e.pool, 'ledger')) >= 3,
    );
    const { rows: stuck } = await e.pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM actionledger.operations WHERE status = 'executing'",
    );
    t.ok((stuck[0]?.n ?? 0) >= 1, `claims are held while the disk is full (${stuck[0]?.n})`);
    await e.pool.query('DELETE FROM public.disk_full');

    for (const r of reserved) {
      t.equal((await settled(e.pool, r.operation_id, 30_000)).status, 'succeeded', `${r.operation_id} succeeded`);
      t.equal(e.provider.requestsFor(r.effect_key), 1, 'one provider request for its key');
    }
    const hist = await histories(
      e.pool,
      reserved.map((r) => r.operation_id),
    );
    const releases = [...hist.values()]
      .flat()
      .filter((h) => h.from_status === 'executing' && h.to_status === 'pending');
    t.ok(releases.length >= 1, `claims were released (${releases.length})`);
    for (const r of releases) {
      t.equal(r.reason, 'released:storage_full');
      t.match(r.detail, { sqlstate: '53100', sent: false, provider_called: false });
    }
    for (const r of reserved)
      t.same(historyProblems(hist.get(r.operation_id) ?? [], 'succeeded'), [], 'a legal history');
  },
);

t.test(
  'an outcome that cannot be written after the send is written once the disk has room, and never sent again',
  async (t) => {
    const e = await dispatchEnv(t);
    await installFullDisk(e.pool);
    const reserved: { operation_id: string; effect_key: string }[] = [];
    for (let i = 0; i < 6; i++) reserved.push(await e.ledger.reserve(ctx(`outcome-${i}`), 'issue_refund', args(i)));
    // Claims and evidence land; every outcome write after the provider call fails.
    await fill(e.pool, ['ledger']);
    await e.dispatcher(8);
    await until('every request to reach the provider', () =>
      Promise.resolve(reserved.every((r) => e.provider.requestsFor(r.effect_key) === 1)),
    );
    await until(
      'the outcome writes to fail again and again',
      async () => (await hits(e.pool, 'ledger')) >= 3 * reserved.length,
    );
    const { rows: held } = await e.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM actionledger.operations WHERE operation_id = ANY($1) AND status = $2',
      [reserved.map((r) => r.operation_id), 'executing'],
    );
    t.equal(held[0]?.n, reserved.length, 'still executing: never released, never sent again');
    // A heartbeat after the claims lists all of them: the reconciler leaves a live worker's owed writes alone.
    await until('the worker to list every claim it owes a write for', async () => {
      const { rows } = await e.pool.query<{ tokens: string[] }>(
        'SELECT claim_tokens AS tokens FROM actionledger.workers',
      );
      const { rows: ops } = await e.pool.query<{ claim_token: string }>(
        'SELECT claim_token FROM actionledger.operations WHERE operation_id = ANY($1)',
        [reserved.map((r) => r.operation_id)],
      );
      return ops.every((o) => rows[0]?.tokens.includes(o.claim_token) === true);
    });
    await e.pool.query('DELETE FROM public.disk_full');

    const hist = await histories(
      e.pool,
      reserved.map((r) => r.operation_id),
    );
    for (const r of reserved) {
      const done = await settled(e.pool, r.operation_id, 30_000);
      t.equal(done.status, 'succeeded', 'the outcome the provider gave was written');
      t.ok(done.provider_receipt, 'with its receipt');
      t.equal(e.provider.requestsFor(r.effect_key), 1, 'sent exactly once');
    }
    const after = await histories(
      e.pool,
      reserved.map((r) => r.operation_id),
    );
    for (const r of reserved) {
      t.notOk(
        (hist.get(r.operation_id) ?? [])
          .concat(after.get(r.operation_id) ?? [])
          .some((h) => h.to_status === 'pending' && h.from_status === 'executing'),
        'a sent operation is never released',
      );
      t.same(historyProblems(after.get(r.operation_id) ?? [], 'succeeded'), [], 'a legal history');
    }
  },
);

t.test('a released claim is claimed again once its backoff is over, without waiting for the poll', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: 60_000 });
  await installFullDisk(e.pool);
  await fill(e.pool, ['evidence']);
  const op = await e.ledger.reserve(ctx('released-once'), 'issue_refund', args(99));
  await e.dispatcher();
  await until('the claim to be released', async () => {
    const { rows } = await e.pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM actionledger.operation_history WHERE operation_id = $1 AND reason = 'released:storage_full'",
      [op.operation_id],
    );
    return (rows[0]?.n ?? 0) === 1;
  });
  await e.pool.query('DELETE FROM public.disk_full');
  // Nothing else wakes this dispatcher before its poll, a minute away: its own wake-up after the backoff does.
  t.equal((await settled(e.pool, op.operation_id, 20_000)).status, 'succeeded');
  t.equal(e.provider.requestsFor(op.effect_key), 1, 'sent once');
});
