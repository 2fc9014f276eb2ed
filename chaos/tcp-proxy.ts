/**
 * A TCP proxy between the workers and PostgreSQL that can delay, pause and reset connections, including in
 * the middle of a COMMIT (for the fault-injection run; loopback only, no external binary).
 *
 * It watches the client-to-server stream for PostgreSQL protocol messages that carry a COMMIT (a simple
 * `Query` or an extended `Parse` whose text starts with COMMIT) and, when armed, destroys both sides right
 * after forwarding that message: the server may or may not have committed, and the client cannot know.
 */
import { createServer, connect, type Server, type Socket } from 'node:net';

export interface ProxyStats {
  connections: number;
  resets: number;
  commitResets: number;
}

export class TcpProxy {
  readonly #target: { host: string; port: number };
  readonly #server: Server;
  readonly #pairs = new Set<[Socket, Socket]>();
  #delayMs = 0;
  #paused = false;
  #held: (() => void)[] = [];
  #commitResets = 0;
  readonly stats: ProxyStats = { connections: 0, resets: 0, commitResets: 0 };

  constructor(target: { host: string; port: number }) {
    this.#target = target;
    this.#server = createServer((client) => this.#accept(client));
  }

  async listen(): Promise<number> {
    await new Promise<void>((resolve) => this.#server.listen(0, '127.0.0.1', resolve));
    return (this.#server.address() as { port: number }).port;
  }

  /** Every chunk in either direction waits this long. */
  setDelay(ms: number): void {
    this.#delayMs = ms;
  }

  /** Holds all traffic (new and existing connections) until resumed. */
  pause(): void {
    this.#paused = true;
  }

  resume(): void {
    this.#paused = false;
    const held = this.#held;
    this.#held = [];
    for (const go of held) go();
  }

  /** Destroys every open connection. */
  resetAll(): void {
    for (const [a, b] of this.#pairs) {
      a.destroy();
      b.destroy();
      this.stats.resets++;
    }
    this.#pairs.clear();
  }

  /** The next `n` COMMITs seen are forwarded and then their connection is reset. */
  resetNextCommits(n: number): void {
    this.#commitResets += n;
  }

  async close(): Promise<void> {
    this.resume();
    this.resetAll();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  #accept(client: Socket): void {
    this.stats.connections++;
    const server = connect(this.#target.port, this.#target.host);
    const pair: [Socket, Socket] = [client, server];
    this.#pairs.add(pair);
    const end = (): void => {
      this.#pairs.delete(pair);
      client.destroy();
      server.destroy();
    };
    client.on('error', end).on('close', end);
    server.on('error', end).on('close', end);
    this.#pipe(client, server, true, end);
    this.#pipe(server, client, false, end);
  }

  #pipe(from: Socket, to: Socket, toServer: boolean, end: () => void): void {
    let queue = Promise.resolve();
    from.on('data', (chunk: Buffer) => {
      from.pause();
      queue = queue.then(async () => {
        if (this.#paused) await new Promise<void>((r) => this.#held.push(r));
        if (this.#delayMs > 0) await new Promise((r) => setTimeout(r, this.#delayMs));
        if (to.destroyed) return;
        to.write(chunk);
        if (toServer && this.#commitResets > 0 && carriesCommit(chunk)) {
          this.#commitResets--;
          this.stats.commitResets++;
          // Give the server a moment to read the COMMIT, then cut both sides before the answer arrives.
          setTimeout(end, 1);
          return;
        }
        from.resume();
      });
    });
  }
}

/** True when a client-to-server chunk holds a Query ('Q') or Parse ('P') message whose SQL starts with COMMIT. */
export function carriesCommit(chunk: Buffer): boolean {
  let i = 0;
  while (i + 5 <= chunk.length) {
    const type = chunk[i];
    const len = chunk.readUInt32BE(i + 1);
    if (len < 4) return false;
    if (type === 0x51 /* Q */) {
      if (/^\s*COMMIT\b/i.test(chunk.subarray(i + 5, Math.min(chunk.length, i + 1 + len)).toString('utf8')))
        return true;
    } else if (type === 0x50 /* P */) {
      const body = chunk.subarray(i + 5, Math.min(chunk.length, i + 1 + len));
      const nul = body.indexOf(0);
      if (nul >= 0 && /^\s*COMMIT\b/i.test(body.subarray(nul + 1).toString('utf8'))) return true;
    }
    i += 1 + len;
  }
  return false;
}
