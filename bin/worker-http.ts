/**
 * The HTTP API in a fleet worker (`actionledger start`): the same server the parent ran alone before
 * (server/http.ts: the API, MCP, the console, the probes, `/metrics`), on node:cluster's shared listener, so
 * every worker serves and the kernel-accepted connections are dealt out round-robin by the parent.
 *
 * What is the fleet's and not this process's comes from the parent (bin/fleet-ipc.ts): `/metrics` (the parent
 * merges its own metrics with every worker's) and the probes' view of the service (the embedded database
 * restarting, the service stopping). What each worker keeps on its own is what is fleet-wide already because
 * it lives in PostgreSQL: the request windows (principals/, counted by each request's authentication), console
 * sessions, approvals, budgets. MCP sessions live in the process that opened them; a request for one that
 * reaches another worker is forwarded to it (server/mcp/peers.ts).
 *
 * The API has a pool of its own (`database.pool_max`), beside the dispatcher's, so a burst of calls never
 * takes the connections a dispatch holds from its batch's opening to its outcome, nor the other way round.
 */
import { join } from 'node:path';
import { resolveEffectKeySecrets } from '../config/index.js';
import { asActionLedgerError } from '../core/errors.js';
import { createPool } from '../db/index.js';
import { EffectKeyer, Ledger } from '../ledger/index.js';
import type { Runtime } from '../runtime/index.js';
import { HttpServer, peerTag, type McpPeers } from '../server/index.js';
import { REFUSED, SERVING, type ParentChannel } from './fleet-ipc.js';

/** What the parent hands a worker in its environment for the API. */
export interface WorkerHttpEnv {
  /** The worker's slot, 1..n (its metrics' `worker` label, its MCP sessions' prefix). */
  slot: number;
  /** The folder of the fleet's peer sockets (server/mcp/peers.ts); none: MCP sessions are not forwarded. */
  peerDir: string | undefined;
  /** Whether the parent runs the embedded database: the development effect-key secret is then read from its file. */
  embedded: boolean;
}

/** The worker's HTTP server, started; stop it with its drain deadline. */
export interface WorkerHttp {
  /** Requests in flight now. */
  readonly inFlight: number;
  stop(drainMs: number): Promise<void>;
}

/**
 * Starts the API on the shared listener and tells the parent (`serving`, or `refused` with the code, then
 * throws it). The API reserves operations, so this worker reads the effect-key secrets as the parent did.
 */
export async function serveHttp(
  rt: Runtime,
  env: NodeJS.ProcessEnv,
  channel: ParentChannel,
  w: WorkerHttpEnv,
): Promise<WorkerHttp> {
  let pool: ReturnType<typeof createPool> | undefined;
  let ledger: Ledger | undefined;
  try {
    const keys = resolveEffectKeySecrets(rt.config, env, { embedded: w.embedded });
    pool = createPool(rt.databaseUrl, {
      max: rt.config.database.poolMax,
      statementTimeoutMs: rt.config.database.statementTimeoutMs,
      applicationName: 'actionledger:api',
      notifications: rt.config.notifications.destinations.size > 0,
    });
    const api: Runtime = { ...rt, pool, effectKeys: keys };
    ledger = new Ledger(rt.config, pool, new EffectKeyer(keys));
    let stopping = false;
    const http = new HttpServer({
      runtime: api,
      ledger,
      env,
      health: () => {
        const parent = channel.health;
        return { error: parent.error, stopping: parent.stopping || stopping };
      },
      metrics: (o) => channel.metrics(o),
      ...(w.peerDir === undefined ? {} : { mcpPeers: peersIn(w.peerDir, w.slot) }),
    });
    await http.start();
    const { address, port } = http.address;
    channel.send({ type: SERVING, address, port });
    const [p, l] = [pool, ledger];
    return {
      get inFlight() {
        return http.inFlight;
      },
      async stop(drainMs) {
        stopping = true;
        await http.stop(drainMs);
        l.stop();
        await p.end().catch(() => undefined);
      },
    };
  } catch (err) {
    const coded = asActionLedgerError(err);
    channel.send({
      type: REFUSED,
      code: coded.code,
      message: coded.message,
      ...(coded.details === undefined ? {} : { details: coded.details }),
    });
    ledger?.stop();
    await pool?.end().catch(() => undefined);
    throw err;
  }
}

function peersIn(dir: string, slot: number): McpPeers {
  return { self: peerTag(slot), socketPath: (tag) => join(dir, `${tag}.sock`) };
}
