import { readFileSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';

/**
 * A loopback port free a moment ago: for a server the test starts (often later, and again after a restart), or,
 * left unused, one nothing answers on. It is picked at random below the kernel's range of ephemeral ports: a
 * port from that range (what listening on port 0 returns) can meanwhile become the local port of any outgoing
 * connection on the machine, such as another test file's database client, and the server that later binds it
 * fails with EADDRINUSE. Below the range only another listener can take it.
 */
export async function freePort(): Promise<number> {
  const low = ephemeralLow();
  for (let i = 0; i < 100; i++) {
    const port = Math.max(1024, low - 12_000) + Math.floor(Math.random() * Math.min(12_000, low - 1024));
    if (await canListen(port)) return port;
  }
  return listenOnce(0);
}

/** The lowest ephemeral port (Linux's `ip_local_port_range`; 32768 where it cannot be read). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 2048 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

async function canListen(port: number): Promise<boolean> {
  return listenOnce(port).then(
    () => true,
    () => false,
  );
}

/** Listens on `port` of 127.0.0.1 and closes again; resolves with the port bound. */
function listenOnce(port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(port, '127.0.0.1', () => {
      const bound = (s.address() as { port: number }).port;
      s.close(() => resolve(bound));
    });
  });
}

/** `url` with its host and port replaced by a loopback proxy's (a database URL the test routes through it). */
export function throughPort(url: string, port: number): string {
  const u = new URL(url);
  u.hostname = '127.0.0.1';
  u.port = String(port);
  return u.toString();
}

/** What a `HoldingProxy` saw after one BEGIN (or trigger): whether every marker reached the server before its reply. */
export interface Hold {
  /** True: every marker arrived while the reply was held; false: `holdMs` ran out first. */
  pipelined: boolean;
  /** The markers that arrived while held. */
  seen: string[];
}

/**
 * A loopback TCP proxy to PostgreSQL that tells whether a client writes statements before the reply to its
 * BEGIN (or to another trigger statement): after a client message that is a simple-protocol `BEGIN`, it holds the
 * server's bytes for that connection until the client has also sent every marker (statement names or texts, as
 * they appear in the protocol messages), or `holdMs` has passed. A client that waits for each reply shows no marker while held.
 * It can also hold what a client writes from its next BEGIN on (`holdNextRequests`; what it wrote before the
 * BEGIN, in the same write or not, is forwarded), so that a test can arrange the server's state before those
 * statements run.
 */
export class HoldingProxy {
  readonly holds: Hold[] = [];
  readonly #server = createServer((client) => this.#accept(client));
  readonly #target: { host: string; port: number };
  readonly #markers: string[];
  readonly #holdMs: number;
  readonly #startsHold: (m: Buffer) => boolean;
  readonly #sockets = new Set<Socket>();
  #requestsArmed: ((text: string) => void) | null = null;
  #requestsRelease: (() => void)[] = [];

  /**
   * `trigger`: the text (a statement's name or text) of the message after which a hold starts, instead of a
   * simple-protocol BEGIN.
   */
  constructor(target: { host: string; port: number }, markers: string[], holdMs = 2_000, trigger?: string) {
    this.#target = target;
    this.#markers = markers;
    this.#holdMs = holdMs;
    this.#startsHold = trigger === undefined ? isBegin : (m) => m.toString('latin1').includes(trigger);
  }

  async listen(): Promise<number> {
    await new Promise<void>((resolve) => this.#server.listen(0, '127.0.0.1', resolve));
    return (this.#server.address() as { port: number }).port;
  }

  /**
   * Holds the next BEGIN any connection sends, and everything that connection writes after it, from the server
   * until `release()`. `arrived` resolves, with the held bytes as text, once every marker is among them.
   */
  holdNextRequests(): { arrived: Promise<string>; release(): void } {
    const arrived = new Promise<string>((resolve) => (this.#requestsArmed = resolve));
    return {
      arrived,
      release: () => {
        for (const go of this.#requestsRelease.splice(0)) go();
      },
    };
  }

  async close(): Promise<void> {
    for (const go of this.#requestsRelease.splice(0)) go();
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  #accept(client: Socket): void {
    const server = connect(this.#target.port, this.#target.host);
    for (const s of [client, server]) {
      this.#sockets.add(s);
      s.on('error', () => undefined).on('close', () => {
        client.destroy();
        server.destroy();
      });
    }
    let held: { sent: string; buffered: Buffer[]; hold: Hold; timer: NodeJS.Timeout } | null = null;
    const release = (): void => {
      if (held === null) return;
      clearTimeout(held.timer);
      for (const b of held.buffered) client.write(b);
      held = null;
    };
    const check = (): void => {
      if (held === null) return;
      const h = held;
      h.hold.seen = this.#markers.filter((m) => h.sent.includes(m));
      if (h.hold.seen.length === this.#markers.length) {
        h.hold.pipelined = true;
        release();
      }
    };
    const messages = new ClientMessages();
    let requests: { chunks: Buffer[]; text: string; arrived: ((text: string) => void) | null } | null = null;
    const holdRequests = (chunk: Buffer, text: string): void => {
      const r = requests!;
      r.chunks.push(chunk);
      r.text += text;
      if (r.arrived !== null && this.#markers.every((m) => r.text.includes(m))) {
        r.arrived(r.text);
        r.arrived = null;
      }
    };
    client.on('data', (chunk: Buffer) => {
      // Forwarded whole messages at a time, so that a hold starts exactly at its BEGIN: what the client wrote
      // before it in the same chunk (a statement pipelined ahead of the transaction) goes to the server now.
      const texts = messages.push(chunk);
      let from = 0;
      const begin = texts.findIndex(isBegin);
      if (requests === null && this.#requestsArmed !== null && begin >= 0) {
        if (begin > 0) server.write(Buffer.concat(texts.slice(0, begin)));
        from = begin;
        requests = { chunks: [], text: '', arrived: this.#requestsArmed };
        this.#requestsArmed = null;
        this.#requestsRelease.push(() => {
          for (const c of requests!.chunks) server.write(c);
          requests = null;
        });
      }
      const rest = texts.slice(from);
      if (rest.length > 0) {
        if (requests !== null) holdRequests(Buffer.concat(rest), rest.map((m) => m.toString('latin1')).join(''));
        else server.write(Buffer.concat(rest));
      }
      for (const m of texts) {
        if (held !== null) held.sent += m.toString('latin1');
        else if (this.#startsHold(m)) {
          const hold: Hold = { pipelined: false, seen: [] };
          this.holds.push(hold);
          held = { sent: '', buffered: [], hold, timer: setTimeout(release, this.#holdMs) };
        }
      }
      check();
    });
    server.on('data', (chunk: Buffer) => {
      if (held !== null) held.buffered.push(chunk);
      else client.write(chunk);
    });
  }
}

/**
 * A `HoldingProxy` (watching for `markers`, after each BEGIN or `trigger`) to the database at `url`, and that
 * database's URL through it.
 */
export async function proxyTo(
  url: string,
  markers: string[],
  trigger?: string,
): Promise<{ proxy: HoldingProxy; url: string }> {
  const u = new URL(url);
  const proxy = new HoldingProxy({ host: u.hostname, port: Number(u.port) }, markers, 2_000, trigger);
  return { proxy, url: throughPort(url, await proxy.listen()) };
}

/** A simple-protocol Query message whose text is BEGIN. */
function isBegin(m: Buffer): boolean {
  return m[0] === 0x51 && /^\s*BEGIN\b/i.test(m.subarray(5).toString('utf8'));
}

/**
 * Splits a client-to-server PostgreSQL stream into whole messages, the untyped startup message first (the
 * proxies' clients do not ask for TLS); bytes of a message not yet complete wait for the rest.
 */
class ClientMessages {
  #buffer = Buffer.alloc(0);
  #started = false;

  push(chunk: Buffer): Buffer[] {
    this.#buffer = Buffer.concat([this.#buffer, chunk]);
    const out: Buffer[] = [];
    for (;;) {
      const head = this.#started ? 1 : 0;
      if (this.#buffer.length < head + 4) return out;
      const end = head + this.#buffer.readUInt32BE(head);
      if (this.#buffer.length < end) return out;
      out.push(this.#buffer.subarray(0, end));
      this.#started = true;
      this.#buffer = this.#buffer.subarray(end);
    }
  }
}
