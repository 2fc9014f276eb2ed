/**
 * A notification survives the death of the process sending it: a real `actionledger dispatcher` process is
 * SIGKILLed while its webhook request hangs at the receiver; the delivery's lease runs out, a second worker
 * process sends it again, and every copy the receiver saw carries the same webhook-id.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import t from 'tap';
import { BIN } from '../helpers/cli.js';
import { dispatchEnv } from '../helpers/fleet.js';
import { receiverPki, WebhookReceiver } from '../helpers/notify-receivers.js';
import { nodeCommand } from '../helpers/node-child.js';

const SECRET = `whsec_${randomBytes(32).toString('base64')}`;

function worker(env: NodeJS.ProcessEnv): { child: ChildProcess; exited: Promise<NodeJS.Signals | null> } {
  const child = spawn(...nodeCommand([BIN, 'dispatcher', '--concurrency', '1']), {
    env: { PATH: process.env.PATH, ...env },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const exited = new Promise<NodeJS.Signals | null>((resolve) =>
    child.once('exit', (_code, signal) => resolve(signal)),
  );
  return { child, exited };
}

async function until(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

t.test('a worker SIGKILLed mid-delivery: the event still arrives, every copy with the same webhook-id', async (t) => {
  const pki = await receiverPki();
  const receiver = await new WebhookReceiver(pki, [SECRET]).start(t);
  receiver.hangFirst = 1;
  const e = await dispatchEnv(
    t,
    {},
    {
      extra: {
        notifications: {
          destinations: {
            ops: {
              type: 'webhook',
              url: `${receiver.url}/hooks`,
              secret_envs: ['WH_SECRET'],
              ca_file: pki.paths.caCert,
              allow_private_network: true, // the receiver listens on loopback
            },
          },
          routes: [{ destinations: ['ops'] }],
          delivery: {
            poll_interval_ms: 50,
            timeout_ms: 3000,
            lease_ms: 4000,
            backoff_initial_ms: 10,
            backoff_max_ms: 20,
          },
        },
      },
      extraEnv: { WH_SECRET: SECRET },
    },
  );
  await e.pool.query(
    `INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason)
     VALUES ('tenant-a', 'issue_refund', 'op-1', 'drill')`,
  );

  const first = worker(e.env);
  t.teardown(() => {
    first.child.kill('SIGKILL');
  });
  await until('the first copy at the receiver', () => receiver.received.length === 1);
  first.child.kill('SIGKILL');
  t.equal(await first.exited, 'SIGKILL', 'the worker died mid-request');
  const held = (
    await e.pool.query<{ status: string; claim_token: string | null; attempts: number }>(
      'SELECT status, claim_token, attempts FROM actionledger.notification_deliveries',
    )
  ).rows;
  t.same(
    held.map((r) => [r.status, r.claim_token !== null, r.attempts]),
    [['pending', true, 1]],
    'the dead worker left its claim, nothing else',
  );

  const second = worker(e.env);
  t.teardown(() => {
    second.child.kill('SIGKILL');
  });
  await until('the delivery to end', async () => {
    const { rows } = await e.pool.query<{ status: string }>('SELECT status FROM actionledger.notification_deliveries');
    return rows[0]?.status === 'delivered';
  });
  second.child.kill('SIGTERM');
  await second.exited;

  t.equal(receiver.received.length, 2, 'sent again once the lease ran out');
  t.equal(new Set(receiver.received.map((r) => r.id)).size, 1, 'both copies carry the same webhook-id');
  t.ok(
    receiver.received.every((r) => r.verified[0] === true),
    'both verify',
  );
  const kept = receiver.accepted();
  t.equal(kept.size, 1, 'a receiver dropping duplicates keeps one event');
  t.equal((kept.values().next().value as { type: string }).type, 'kill_switch.engaged');
  const { rows } = await e.pool.query<{ attempts: number }>(
    'SELECT attempts FROM actionledger.notification_deliveries',
  );
  t.equal(rows[0]?.attempts, 2);
});
