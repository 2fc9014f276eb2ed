import t from 'tap';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { checkInvariants } from '../../chaos/checker.js';
import { carriesCommit } from '../../chaos/tcp-proxy.js';
import { Rng } from '../../chaos/rng.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';
import { nodeCommand } from '../helpers/node-child.js';

const RUN = join(import.meta.dirname, '..', '..', 'chaos', 'run.js');

t.test(
  'the short chaos run: a fleet under crashes, provider, authorizer, network and server faults, kill switches and a revoked role keeps every invariant',
  async (t) => {
    const child = spawn(...nodeCommand([RUN, '--seed', '7', '--ops', '300', '--workers', '3', '--deadline-s', '240']), {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    t.equal(code, 0, `exit 0\n${out}\n${err}`);
    t.comment(
      out
        .split('\n')
        .filter((l) => /^(fault phase|reconcile runs|gate:|after the fault|reviewer)/.test(l))
        .join('\n'),
    );
    t.match(out, /^seed: 7$/m, 'the seed is printed first');
    t.match(out, /\| effect keys with more than one provider effect \| 0 \|/);
    t.match(out, /\| operations lost \| 0 \|/);
    t.match(out, /\| dispatches without a fresh authorization bound to the sent bytes \| 0 \|/);
    t.match(
      out,
      /\| operations left executing or unknown, or in review without a reason, after the final reconciliation \| 0 \|/,
    );
    t.match(out, /\| allowing gate decisions without their audit row \| 0 \|/);
    const faults =
      /fault phase over: (\d+) worker crashes, (\d+) graceful worker stops, (\d+)\/(\d+) reconcile runs crashed, (\d+) PostgreSQL restart, (\d+) proxy faults/.exec(
        out,
      );
    t.ok(faults, 'fault summary printed');
    t.ok(Number(faults?.[1]) > 0, 'workers were SIGKILLed at crash points');
    t.equal(Number(faults?.[5]), 1, 'PostgreSQL was restarted once');
    const midPass = /reconcile runs killed mid-pass \(during a readback\): (\d+)/.exec(out);
    t.ok(Number(midPass?.[1]) > 0, 'some reconcile runs were SIGKILLed while a readback of their pass was in progress');
    const gate =
      /gate: (\d+) agent calls accepted after refusals \((.*)\); kill switches engaged (\d+) per tenant, (\d+) per tool, (\d+) for everything, (\d+) lifted; role revoked (\d+), restored (\d+)/.exec(
        out,
      );
    t.ok(gate, 'gate summary printed');
    t.equal(Number(gate?.[1]), 50, 'every agent call was accepted in the end');
    t.ok(
      [3, 4, 5, 6, 7, 8].every((i) => Number(gate?.[i]) > 0),
      'switches of every scope engaged and lifted, the role revoked and restored',
    );
    t.equal(
      Number(gate?.[3]) + Number(gate?.[4]) + Number(gate?.[5]),
      Number(gate?.[6]),
      'every switch engaged was lifted',
    );
    t.equal(Number(gate?.[7]), Number(gate?.[8]), 'every revocation was restored');
    t.equal(out.trim().split('\n').at(-1), 'invariants: 0 violated', 'the last line');
  },
);

t.test(
  'the checker counts what it must: duplicate effects, lost operations, unsettled rows, unauthorized sends, broken histories, unaudited gate decisions',
  async (t) => {
    const e = await dispatchEnv(t);
    const ok = await e.ledger.reserve(ctx('c-1'), 'issue_refund', { order_id: 'c1', amount: 1, currency: 'EUR' });
    const open = await e.ledger.reserve(ctx('c-2'), 'issue_refund', { order_id: 'c2', amount: 2, currency: 'EUR' });
    await e.pool.query(`DELETE FROM actionledger.outbox WHERE operation_id = $1`, [open.operation_id]);
    await e.dispatcher(1);
    t.equal((await settled(e.pool, ok.operation_id)).status, 'succeeded');
    const clean = await checkInvariants({
      pool: e.pool,
      schema: 'actionledger',
      reservedIds: [ok.operation_id],
      effects: e.provider.allEffects(),
      requests: e.provider.requests(),
    });
    t.equal(clean.violated, 1, 'only the operation left pending');
    t.match(
      clean.invariants.find((i) => i.violations > 0),
      { name: 'operations not at an end or in review with a reason', violations: 1 },
    );

    const effect = e.provider.allEffects()[0];
    const request = e.provider.requests().find((r) => r.method === 'POST');
    t.ok(effect && request);
    const dirty = await checkInvariants({
      pool: e.pool,
      schema: 'actionledger',
      reservedIds: [ok.operation_id, '00000000-0000-4000-8000-000000000000'],
      effects: [effect!, effect!],
      requests: [
        request!,
        { ...request!, body: '{"amount":999999}' },
        { ...request!, at: new Date(Date.now() + 3_600_000) },
      ],
    });
    const by = Object.fromEntries(dirty.invariants.map((i) => [i.name, i.violations]));
    t.equal(by['effect keys with more than one provider effect'], 1);
    t.equal(by['operations lost'], 1);
    t.equal(
      by['dispatches without a fresh authorization bound to the sent bytes'],
      2,
      'other bytes, and a send after the evidence expired',
    );
    await e.pool.query(
      `INSERT INTO actionledger.operation_history (operation_id, from_status, to_status, actor, reason) VALUES ($1, 'succeeded', 'pending', 'x', 'x')`,
      [ok.operation_id],
    );
    const broken = await checkInvariants({
      pool: e.pool,
      schema: 'actionledger',
      reservedIds: [],
      effects: [],
      requests: [],
    });
    t.ok(broken.invariants.find((i) => i.name === 'illegal transitions or broken histories')!.violations >= 1);
    t.equal(broken.invariants.find((i) => i.name === 'succeeded operations without a provider effect')!.violations, 1);

    const left = 'operations left executing or unknown, or in review without a reason, after the final reconciliation';
    t.equal(broken.invariants.find((i) => i.name === left)!.violations, 0, 'a pending row is not in flight');
    await e.pool.query(
      `UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid(), claimed_by = 'x', claimed_at = now() WHERE operation_id = $1`,
      [open.operation_id],
    );
    const inFlight = await checkInvariants({
      pool: e.pool,
      schema: 'actionledger',
      reservedIds: [],
      effects: [],
      requests: [],
    });
    t.match(
      inFlight.invariants.find((i) => i.name === left),
      { violations: 1, examples: [`${open.operation_id}: executing`] },
    );

    const unaudited = 'allowing gate decisions without their audit row';
    t.equal(
      inFlight.invariants.find((i) => i.name === unaudited)!.violations,
      0,
      'nothing reserved through the gate, no change made',
    );
    await e.pool.query(
      `INSERT INTO actionledger.gate_operations (operation_id, tenant_id, principal_id, role, approval_kind) VALUES ($1, 'tenant-a', 'p', 'agent', 'auto')`,
      [ok.operation_id],
    );
    const changes = [
      { action: 'kill_switch', outcome: 'engaged', tenant_id: '*', key: 'issue_refund' },
      { action: 'role', outcome: 'revoked', tenant_id: 'tenant-a', key: 'p/agent' },
    ] as const;
    const missing = await checkInvariants({
      pool: e.pool,
      schema: 'actionledger',
      reservedIds: [],
      effects: [],
      requests: [],
      gateChanges: changes,
    });
    t.equal(
      missing.invariants.find((i) => i.name === unaudited)!.violations,
      3,
      'a reservation without its allowed call, a switch and a revocation without their rows',
    );
    await e.pool.query(
      `INSERT INTO actionledger.gate_audit (action, outcome, tenant_id, principal_id, role, tool_name, subject_id)
     VALUES ('call', 'allowed', 'tenant-a', 'p', 'agent', 'issue_refund', $1), ('kill_switch', 'engaged', '*', 'operator', NULL, 'issue_refund', NULL),
            ('role', 'revoked', 'tenant-a', 'p', 'agent', NULL, NULL)`,
      [ok.operation_id],
    );
    const audited = await checkInvariants({
      pool: e.pool,
      schema: 'actionledger',
      reservedIds: [],
      effects: [],
      requests: [],
      gateChanges: changes,
    });
    t.equal(audited.invariants.find((i) => i.name === unaudited)!.violations, 0, 'each has its row');
    const twice = await checkInvariants({
      pool: e.pool,
      schema: 'actionledger',
      reservedIds: [],
      effects: [],
      requests: [],
      gateChanges: [...changes, changes[0]],
    });
    t.equal(twice.invariants.find((i) => i.name === unaudited)!.violations, 1, 'a switch engaged twice needs two rows');
  },
);

t.test('the proxy sees a COMMIT in simple and extended protocol messages; the PRNG is deterministic', (t) => {
  const q = (sql: string): Buffer => {
    const body = Buffer.from(`${sql}\0`);
    const b = Buffer.alloc(5 + body.length);
    b[0] = 0x51;
    b.writeUInt32BE(4 + body.length, 1);
    body.copy(b, 5);
    return b;
  };
  t.ok(carriesCommit(q('COMMIT')));
  t.ok(carriesCommit(Buffer.concat([q('SELECT 1'), q(' commit')])));
  t.notOk(carriesCommit(q('SELECT commit_ts FROM t')));
  t.notOk(carriesCommit(q('BEGIN')));
  const a = new Rng(5);
  const b = new Rng(5);
  t.same(
    Array.from({ length: 5 }, () => a.int(0, 1000)),
    Array.from({ length: 5 }, () => b.int(0, 1000)),
  );
  t.end();
});
