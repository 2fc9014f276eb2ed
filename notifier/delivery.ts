/**
 * The notification delivery loop, run by every dispatcher worker beside its dispatcher. Events are written by
 * database triggers in the same transaction as the change they report (sql/0013_notifications.sql), so an
 * event exists exactly when its change committed. Each tick:
 *
 *   route:   take unrouted events (FOR UPDATE SKIP LOCKED), insert one delivery per matching destination,
 *            mark them routed; one transaction
 *   claim:   take due deliveries (pending, next_attempt_at passed, no live lease) FOR UPDATE SKIP LOCKED,
 *            with a lease and a new claim token, attempts + 1
 *   send:    a signed webhook (Standard Webhooks, webhook-id = the event id on every attempt) or a Slack call
 *   outcome: delivered | retry after backoff | failed (attempts spent or refused for good), fenced on the claim
 *            token, with its audit row in the same transaction
 *   prune:   at most once a minute, events older than retention_days with no pending delivery are removed
 *
 * A worker that dies mid-send leaves its lease to run out; another worker sends the delivery again with the
 * same webhook-id, so a receiver sees at least one copy and drops the rest by id. A worker that outlives its
 * lease (it cannot while lease_ms > timeout_ms) finds its claim gone and writes nothing.
 *
 * What this does not promise: exactly-once arrival (receivers deduplicate), ordering between events, or that
 * a Slack message was not posted twice when a post's answer was lost (Slack has no idempotency key).
 */
import cluster from 'node:cluster';
import { randomUUID } from 'node:crypto';
import { Counter, type Registry } from 'prom-client';
import type { Config } from '../config/index.js';
import type { NotificationEventType, NotificationRoute } from '../config/index.js';
import { bindQueries, withTransaction, type Pool, type Queryable } from '../db/index.js';
import { asActionLedgerError } from '../core/errors.js';
import { postJson } from '../transport/index.js';
import type { Logger } from '../core/log.js';
import { Service } from '../core/service.js';
import { backoffMs } from '../core/retry.js';
import type { AuditWriter } from '../gate/index.js';
import { notifierQueries } from './queries.js';
import { slackApprovalRequest, slackDecision, slackNotice, txt, webhookBody, type ClaimedEvent } from './render.js';
import { standardWebhookHeaders } from './signing.js';
import {
  closeClients,
  destinationClients,
  outcomeError,
  slackCall,
  warnPrivateNetwork,
  type ClientOptions,
  type DestinationClient,
} from './transport.js';

type Outcome =
  | { kind: 'delivered'; slackMessage?: { channel: string; ts: string; approvalId: string; hash: string } }
  | { kind: 'retry'; error: string }
  | { kind: 'failed'; error: string }
  | { kind: 'released' };

/** How often one worker sweeps expired events (every worker does; SKIP LOCKED keeps them apart). */
const PRUNE_EVERY_MS = 60_000;

export interface NotificationDeliveryOptions {
  config: Config;
  pool: Pool;
  audit: AuditWriter;
  log: Logger;
  env: NodeJS.ProcessEnv;
  /** Where `actionledger_notification_attempts_total{destination,outcome}` is registered (else unexposed). */
  registry?: Registry;
  /** Resolves destination names instead of the system resolver (tests: a test-only name on loopback). */
  lookup?: ClientOptions['lookup'];
}

/** Whether `route` sends events of this type, tenant and tool ('*' and a null tool concern every one). */
export function routeMatches(
  route: NotificationRoute,
  type: NotificationEventType,
  tenant: string,
  tool: string | null,
): boolean {
  if (route.events !== null && !route.events.has(type)) return false;
  if (route.tenants !== null && tenant !== '*' && !route.tenants.has(tenant)) return false;
  if (route.tools !== null && tool !== null && !route.tools.has(tool)) return false;
  return true;
}

export class NotificationDelivery extends Service {
  readonly #config: Config;
  readonly #pool: Pool;
  readonly #audit: AuditWriter;
  readonly #log: Logger;
  readonly #q: Readonly<typeof notifierQueries>;
  readonly #clients: ReadonlyMap<string, DestinationClient>;
  readonly #attempts: Counter<'destination' | 'outcome'>;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #nextPrune = 0;

  /** Reads the destinations' secrets and certificates now: throws `secret_missing` or `config_invalid`. */
  constructor(options: NotificationDeliveryOptions) {
    super();
    this.#config = options.config;
    this.#pool = options.pool;
    this.#audit = options.audit;
    this.#log = options.log;
    this.#q = bindQueries(notifierQueries, options.config.schemaQuoted);
    this.#clients = destinationClients(
      options.config.notifications,
      options.env,
      options.lookup === undefined ? {} : { lookup: options.lookup },
    );
    this.#attempts = new Counter({
      name: 'actionledger_notification_attempts_total',
      help: 'Notification delivery attempts by destination and outcome (delivered, retry, failed)',
      labelNames: ['destination', 'outcome'],
      registers: options.registry === undefined ? [] : [options.registry],
    });
  }

  /** Whether any destination is configured (without one, start() does nothing). */
  get enabled(): boolean {
    return this.#clients.size > 0;
  }

  /** Starts polling (with no destination configured, nothing). */
  protected onStart(): Promise<void> {
    if (!this.enabled) return Promise.resolve();
    // A fleet worker leaves it to the service, which says it once for the fleet (bin/service.ts).
    if (!cluster.isWorker) warnPrivateNetwork(this.#config.notifications, this.#log);
    this.#schedule(0);
    return Promise.resolve();
  }

  /** Stops polling and waits for the tick in flight (bounded by the delivery timeout). */
  protected async onStop(): Promise<void> {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#running;
    await closeClients(this.#clients);
  }

  #schedule(ms: number): void {
    if (this.lifecycle !== 'running' && this.lifecycle !== 'starting') return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#running = this.tick()
        .then((n) => this.#schedule(n >= this.#config.notifications.delivery.batchSize ? 0 : this.#poll()))
        .catch((err: unknown) => {
          this.#log.warn({ code: asActionLedgerError(err).code, err }, 'notification delivery tick failed');
          this.#schedule(this.#poll());
        });
    }, ms);
  }

  #poll(): number {
    return this.#config.notifications.delivery.pollIntervalMs;
  }

  /**
   * Removes what the outbox no longer needs: events (with their deliveries) older than `retention_days` none
   * of whose deliveries is pending, first ending as failed (audited) the pending deliveries of such old events
   * to a destination this configuration does not name. Up to `batch` events per call; returns how many.
   */
  async prune(batch = 1000): Promise<number> {
    const d = this.#config.notifications.delivery;
    await withTransaction(this.#pool, async (c) => {
      const { rows } = await c.query<ClaimedEvent>(this.#q.deliveriesAbandon, [
        d.retentionDays,
        [...this.#clients.keys()],
        batch,
      ]);
      for (const e of rows) await this.#auditEnd(c, e, { kind: 'failed', error: 'destination_removed' });
    });
    return withTransaction(this.#pool, async (c) => {
      const ids = (await c.query<{ event_id: string }>(this.#q.eventsExpired, [d.retentionDays, batch])).rows.map(
        (r) => r.event_id,
      );
      if (ids.length === 0) return 0;
      await c.query(this.#q.deliveriesDeleteOf, [ids]);
      await c.query(this.#q.eventsDelete, [ids]);
      return ids.length;
    });
  }

  /**
   * One pass: route new events, then claim and send due deliveries, and (at most once a minute) prune.
   * Returns how many deliveries it claimed.
   */
  async tick(): Promise<number> {
    if (Date.now() >= this.#nextPrune) {
      this.#nextPrune = Date.now() + PRUNE_EVERY_MS;
      await this.prune();
    }
    await this.#route();
    const d = this.#config.notifications.delivery;
    const token = randomUUID();
    const { rows } = await this.#pool.query<ClaimedEvent>(this.#q.deliveriesClaim, [
      d.batchSize,
      d.leaseMs,
      token,
      [...this.#clients.keys()],
    ]);
    await Promise.all(rows.map((row) => this.#deliver(row, token)));
    return rows.length;
  }

  async #route(): Promise<void> {
    const n = this.#config.notifications;
    await withTransaction(this.#pool, async (c) => {
      const { rows } = await c.query<{
        event_id: string;
        event_type: NotificationEventType;
        tenant_id: string;
        tool_name: string | null;
      }>(this.#q.eventsClaimUnrouted, [n.delivery.batchSize * 4]);
      const ids: string[] = [];
      const dests: string[] = [];
      for (const e of rows) {
        const matched = new Set<string>();
        for (const r of n.routes)
          if (routeMatches(r, e.event_type, e.tenant_id, e.tool_name)) for (const d of r.destinations) matched.add(d);
        for (const d of matched) {
          ids.push(e.event_id);
          dests.push(d);
        }
      }
      if (ids.length > 0) await c.query(this.#q.deliveriesInsert, [ids, dests]);
    });
  }

  async #deliver(e: ClaimedEvent, token: string): Promise<void> {
    const client = this.#clients.get(e.destination);
    let outcome: Outcome;
    try {
      // A destination this configuration does not name may be one a newer configuration added (a rolling
      // deploy): the claim is handed back untouched for a worker that knows it, never ended here.
      outcome =
        client === undefined
          ? { kind: 'released' }
          : client.destination.type === 'webhook'
            ? await this.#webhook(client, e)
            : await this.#slack(client, e);
    } catch (err) {
      outcome = { kind: 'retry', error: asActionLedgerError(err).code };
    }
    if (outcome.kind === 'retry' && outcome.error.includes('not_sent:private_network:'))
      this.#log.warn(
        { code: 'private_network_refused', event_id: e.event_id, destination: e.destination, error: outcome.error },
        'notification not sent: the destination resolved to an internal address (allow_private_network is not set)',
      );
    if (outcome.kind === 'retry' && e.attempts >= this.#config.notifications.delivery.maxAttempts)
      outcome = { kind: 'failed', error: `attempts_spent:${outcome.error}` };
    // Labelled by configured destination names only: a released claim is no attempt.
    if (client !== undefined) this.#attempts.inc({ destination: e.destination, outcome: outcome.kind });
    try {
      await this.#record(e, token, outcome);
    } catch (err) {
      // The lease runs out and the delivery is sent again (same webhook-id): at least once, never lost.
      this.#log.warn(
        { code: asActionLedgerError(err).code, err, event_id: e.event_id, destination: e.destination },
        'notification outcome not recorded',
      );
    }
  }

  async #record(e: ClaimedEvent, token: string, outcome: Outcome): Promise<void> {
    const d = this.#config.notifications.delivery;
    await withTransaction(this.#pool, async (c) => {
      let n: number | null;
      if (outcome.kind === 'delivered') {
        n = (await c.query(this.#q.deliveryDelivered, [e.event_id, e.destination, token])).rowCount;
        const m = outcome.slackMessage;
        if (n === 1 && m !== undefined)
          await c.query(this.#q.slackMessageInsert, [
            e.destination,
            m.channel,
            m.ts,
            m.approvalId,
            e.tenant_id,
            m.hash,
          ]);
      } else if (outcome.kind === 'released') {
        await c.query(this.#q.deliveryRelease, [e.event_id, e.destination, token, d.backoffInitialMs]);
        return;
      } else if (outcome.kind === 'retry') {
        const policy = { baseDelayMs: d.backoffInitialMs, maxDelayMs: d.backoffMaxMs, jitter: 0.25 };
        const jittered = backoffMs(policy, e.attempts);
        n = (await c.query(this.#q.deliveryRetry, [e.event_id, e.destination, token, jittered, outcome.error]))
          .rowCount;
      } else {
        n = (await c.query(this.#q.deliveryFailed, [e.event_id, e.destination, token, outcome.error])).rowCount;
      }
      if (n !== 1 || outcome.kind === 'retry') return; // claim lost (nothing written), or not an end yet
      await this.#auditEnd(c, e, outcome);
    });
  }

  #auditEnd(c: Queryable, e: ClaimedEvent, outcome: Outcome): Promise<void> {
    return this.#audit.decision(c, {
      action: 'notification',
      outcome: outcome.kind,
      context: { tenant_id: e.tenant_id },
      tool: e.tool_name,
      subjectId: e.event_id,
      detail: {
        event_type: e.event_type,
        destination: e.destination,
        subject: e.subject_id,
        attempts: e.attempts,
        ...(outcome.kind === 'failed' ? { error: outcome.error } : {}),
      },
    });
  }

  async #webhook(client: DestinationClient, e: ClaimedEvent): Promise<Outcome> {
    const d = client.destination;
    if (d.type !== 'webhook') return { kind: 'failed', error: 'not_webhook' };
    const body = webhookBody(this.#config, e);
    const limits = this.#config.notifications.delivery;
    const headers = standardWebhookHeaders(e.event_id, Math.floor(Date.now() / 1000), body, client.webhookSecrets);
    const out = await postJson(client.agent, d.url, {
      body,
      spanName: 'notification',
      headers: { ...headers, 'content-type': 'application/json' },
      timeoutMs: limits.timeoutMs,
      maxBytes: limits.maxResponseBytes,
    });
    const status = out.kind === 'not_sent' ? undefined : out.status;
    // A 2xx is an acceptance whatever its body says (receivers often answer text, which the JSON client
    // reports as malformed); a redirect is never followed and counts as a failed attempt.
    if (status !== undefined && status >= 200 && status < 300 && (out.kind === 'response' || out.code !== 'redirect'))
      return { kind: 'delivered' };
    if (status === 410) return { kind: 'failed', error: 'http_410_gone' };
    return { kind: 'retry', error: out.kind === 'response' ? `http_${out.status}` : outcomeError(out) };
  }

  async #slack(client: DestinationClient, e: ClaimedEvent): Promise<Outcome> {
    const d = client.destination;
    if (d.type !== 'slack') return { kind: 'failed', error: 'not_slack' };
    const limits = {
      timeoutMs: this.#config.notifications.delivery.timeoutMs,
      maxBytes: this.#config.notifications.delivery.maxResponseBytes,
    };
    const post = async (msg: { text: string; blocks: unknown[] }, method = 'chat.postMessage', extra = {}) => {
      const r = await slackCall(
        client,
        method,
        { channel: d.channel, text: msg.text, blocks: msg.blocks as never, unfurl_links: false, ...extra },
        limits,
      );
      return r;
    };
    const ended = (r: Awaited<ReturnType<typeof post>>): Outcome =>
      r.ok ? { kind: 'delivered' } : { kind: r.retry ? 'retry' : 'failed', error: `slack:${r.error}` };

    if (e.event_type === 'approval.requested') {
      const approvalId = txt(e.payload.approval_id);
      const posted = await this.#pool.query(this.#q.slackMessageByApproval, [d.name, approvalId]);
      if (posted.rowCount === 1) return { kind: 'delivered' };
      // Decided or expired before this delivery: nothing to ask any more (its own event posts the outcome).
      const now = await this.#pool.query<{ status: string }>(this.#q.approvalStatusNow, [approvalId]);
      if (now.rows[0]?.status !== 'pending') return { kind: 'delivered' };
      const r = await post(slackApprovalRequest(this.#config, e));
      if (!r.ok) return ended(r);
      const channel = typeof r.json.channel === 'string' ? r.json.channel : d.channel;
      const ts = typeof r.json.ts === 'string' ? r.json.ts : null;
      if (ts === null) return { kind: 'failed', error: 'slack:no_ts' };
      return {
        kind: 'delivered',
        slackMessage: { channel, ts, approvalId, hash: txt(e.payload.envelope_sha256) },
      };
    }
    if (e.event_type === 'approval.decided' || e.event_type === 'approval.expired') {
      const approvalId = txt(e.payload.approval_id);
      // Deliveries run in parallel: only the event that states the approval's current status writes the
      // message, so a late `approved` never overwrites the `executed` or `invalidated` that followed it.
      const now = await this.#pool.query<{ status: string }>(this.#q.approvalStatusNow, [approvalId]);
      if (now.rows[0]?.status !== e.payload.status) return { kind: 'delivered' };
      const m = (
        await this.#pool.query<{ channel: string; message_ts: string }>(this.#q.slackMessageByApproval, [
          d.name,
          approvalId,
        ])
      ).rows[0];
      if (m !== undefined)
        return ended(
          await slackCall(
            client,
            'chat.update',
            { channel: m.channel, ts: m.message_ts, ...slackDecision(e) } as never,
            limits,
          ),
        );
      const waiting = await this.#pool.query(this.#q.requestDeliveryPending, [approvalId, d.name]);
      if ((waiting.rowCount ?? 0) > 0) return { kind: 'retry', error: 'request_message_pending' };
      return ended(await post(slackDecision(e)));
    }
    return ended(await post(slackNotice(e)));
  }
}
