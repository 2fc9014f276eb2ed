/**
 * `Ledger.reserve` when the database fails: a coded error with the SQLSTATE in details (never `internal`),
 * and nothing half-written. The disk-full fault is a trigger on the outbox, the last table the reservation
 * statement writes, raising SQLSTATE 53100 while a flag row exists.
 */
import t from 'tap';
import { createPool, type Pool } from '../../db/db.js';
import { isActionLedgerError } from '../../core/errors.js';
import { Ledger } from '../../ledger/index.js';
import { ctx, ledgerFixture, testConfig, testKeyer } from '../helpers/db.js';

const args = { order_id: 'ord-1', amount: 1000, currency: 'EUR' };

async function rows(pool: Pool): Promise<{ ops: number; outbox: number; history: number }> {
  const { rows: r } = await pool.query<{ ops: string; outbox: string; history: string }>(
    `SELECT (SELECT count(*) FROM actionledger.operations) AS ops, (SELECT count(*) FROM actionledger.outbox) AS outbox,
            (SELECT count(*) FROM actionledger.operation_history) AS history`,
  );
  return { ops: Number(r[0]?.ops), outbox: Number(r[0]?.outbox), history: Number(r[0]?.history) };
}

t.test('disk full while reserving: storage_full with the SQLSTATE, no operation, history or outbox row', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  await pool.query(`
    CREATE TABLE public.ledger_disk_full (on_since timestamptz NOT NULL DEFAULT now());
    CREATE FUNCTION public.ledger_disk_full_raise() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM public.ledger_disk_full) THEN
        RAISE EXCEPTION 'could not extend file: No space left on device (injected)' USING ERRCODE = '53100';
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER ledger_disk_full BEFORE INSERT ON actionledger.outbox FOR EACH ROW EXECUTE FUNCTION public.ledger_disk_full_raise();
    INSERT INTO public.ledger_disk_full DEFAULT VALUES;`);
  const err = await ledger.reserve(ctx(), 'issue_refund', args).then(
    () => null,
    (e: unknown) => e,
  );
  t.ok(isActionLedgerError(err, 'storage_full'), `storage_full, got ${String(err)}`);
  t.match(err, { code: 'storage_full', details: { sqlstate: '53100' } });
  t.notMatch((err as Error).message, /injected/, 'the server message is not passed on');
  t.same(await rows(pool), { ops: 0, outbox: 0, history: 0 }, 'nothing half-written');

  await pool.query('DELETE FROM public.ledger_disk_full');
  t.match(await ledger.reserve(ctx(), 'issue_refund', args), { created: true }, 'reserves once space is back');
  t.same(await rows(pool), { ops: 1, outbox: 1, history: 1 });
});

t.test('database unreachable: database_unavailable, nothing written', async (t) => {
  const { url, pool } = await ledgerFixture(t);
  // Nothing listens on port 1.
  const gone = createPool('postgres://nobody@127.0.0.1:1/none', {
    max: 1,
    statementTimeoutMs: 1000,
    applicationName: 'test-gone',
  });
  const ledger = new Ledger(testConfig(url), gone, testKeyer());
  t.teardown(async () => {
    ledger.stop();
    await gone.end();
  });
  await t.rejects(ledger.reserve(ctx(), 'issue_refund', args), { code: 'database_unavailable' });
  t.same(await rows(pool), { ops: 0, outbox: 0, history: 0 });
});
