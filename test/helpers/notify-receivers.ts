/**
 * The far ends of notifications, as real HTTPS servers on loopback with certificates from a PKI generated for
 * the run: a webhook receiver that verifies every request with the reference `standardwebhooks` library (and
 * can fail or hang on chosen attempts), and a server that plays Slack's Web API (chat.postMessage,
 * chat.update, chat.postEphemeral) and records what it was asked.
 */
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Webhook } from 'standardwebhooks';
import type { Test } from 'tap';
import { writePki, type DevPki } from '../../sandbox/pki.js';

/** A fresh PKI for the run (its CA file is what a destination's `ca_file` names). */
export async function receiverPki(): Promise<DevPki> {
  return writePki(mkdtempSync(join(tmpdir(), 'al-notify-pki-')));
}

abstract class HttpsStub {
  readonly #sockets = new Set<Socket>();
  #server: Server | undefined;
  #port = 0;

  constructor(private readonly pki: DevPki) {}

  get url(): string {
    return `https://localhost:${this.#port}`;
  }

  async start(t: Test): Promise<this> {
    const server = createServer({ cert: this.pki.server.cert, key: this.pki.server.key }, (req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => this.handle(req, Buffer.concat(chunks), res));
    });
    server.on('connection', (s: Socket) => {
      this.#sockets.add(s);
      s.once('close', () => this.#sockets.delete(s));
    });
    this.#server = server;
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    this.#port = (server.address() as { port: number }).port;
    t.teardown(() => this.stop());
    return this;
  }

  async stop(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    const server = this.#server;
    this.#server = undefined;
    if (server !== undefined) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  protected abstract handle(req: IncomingMessage, body: Buffer, res: ServerResponse): void;
}

export interface ReceivedWebhook {
  id: string;
  timestamp: string;
  signature: string;
  body: string;
  /** For each secret the receiver holds: did the reference library accept the request? */
  verified: boolean[];
  /** What the receiver answered: a status, or 'hung' (no answer). */
  answer: number | 'hung';
}

/** Answers 500 to the first `failFirst` requests, leaves the first `hangFirst` unanswered, then 204. */
export class WebhookReceiver extends HttpsStub {
  readonly received: ReceivedWebhook[] = [];
  failFirst = 0;
  hangFirst = 0;
  /** Answer with this status once past the failures and hangs (default 204). */
  finalStatus = 204;
  /** With a 3xx final status: the Location sent (a sender must never follow it). */
  location: string | undefined;
  readonly #secrets: string[];

  constructor(pki: DevPki, secrets: string[]) {
    super(pki);
    this.#secrets = secrets;
  }

  /** The bodies accepted (2xx), parsed, one per distinct webhook-id: what a deduplicating receiver keeps. */
  accepted(): Map<string, Record<string, unknown>> {
    const out = new Map<string, Record<string, unknown>>();
    for (const r of this.received)
      if (typeof r.answer === 'number' && r.answer < 300 && !out.has(r.id))
        out.set(r.id, JSON.parse(r.body) as Record<string, unknown>);
    return out;
  }

  protected handle(req: IncomingMessage, body: Buffer, res: ServerResponse): void {
    const h = (n: string): string => (typeof req.headers[n] === 'string' ? req.headers[n] : '');
    const headers = {
      'webhook-id': h('webhook-id'),
      'webhook-timestamp': h('webhook-timestamp'),
      'webhook-signature': h('webhook-signature'),
    };
    const verified = this.#secrets.map((s) => {
      try {
        new Webhook(s).verify(body, headers);
        return true;
      } catch {
        return false;
      }
    });
    const n = this.received.length;
    const answer = n < this.hangFirst ? 'hung' : n < this.hangFirst + this.failFirst ? 500 : this.finalStatus;
    this.received.push({
      id: headers['webhook-id'],
      timestamp: headers['webhook-timestamp'],
      signature: headers['webhook-signature'],
      body: body.toString('utf8'),
      verified,
      answer,
    });
    if (answer === 'hung') return;
    // A receiver that verifies nothing it cannot check: any signature failure is a 401.
    res.statusCode = verified.some((v) => v) ? answer : 401;
    if (this.location !== undefined) res.setHeader('location', this.location);
    res.end(answer < 300 ? 'ok' : 'try again');
  }
}

export interface SlackCallRecord {
  method: string;
  authorization: string;
  body: Record<string, unknown>;
}

/** Slack's Web API as far as the notifier uses it: every call recorded, `ts` values counting up. */
export class FakeSlack extends HttpsStub {
  readonly calls: SlackCallRecord[] = [];
  #ts = 1000;

  constructor(
    pki: DevPki,
    private readonly botToken: string,
  ) {
    super(pki);
  }

  /** The API base URL a destination's `api_base_url` names. */
  get apiBase(): string {
    return `${this.url}/api`;
  }

  of(method: string): SlackCallRecord[] {
    return this.calls.filter((c) => c.method === method);
  }

  protected handle(req: IncomingMessage, body: Buffer, res: ServerResponse): void {
    const method = (req.url ?? '').replace(/^\/api\//, '');
    const authorization = typeof req.headers.authorization === 'string' ? req.headers.authorization : '';
    let parsed: Record<string, unknown> = {};
    try {
      parsed = JSON.parse(body.toString('utf8')) as Record<string, unknown>;
    } catch {
      parsed = {};
    }
    this.calls.push({ method, authorization, body: parsed });
    res.setHeader('content-type', 'application/json');
    if (authorization !== `Bearer ${this.botToken}`) {
      res.end(JSON.stringify({ ok: false, error: 'invalid_auth' }));
      return;
    }
    const ts = `${(this.#ts += 1)}.000100`;
    res.end(JSON.stringify({ ok: true, channel: parsed.channel, ts: method === 'chat.update' ? parsed.ts : ts }));
  }
}
