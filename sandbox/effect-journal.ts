/**
 * The sandbox provider's memory on disk: one JSON line per applied effect, appended and flushed before the
 * receipt goes out, read back when the provider starts. With it, `npm start` after a restart still knows every
 * refund it applied, so readback and `verify` see the same effects as before (a real provider does not forget).
 *
 * A line cut short by a crash mid-append is dropped on load: its receipt was never sent, so the dispatcher saw
 * no answer, and readback saying "not applied" is the truth the provider now has.
 */
import {
  closeSync,
  fdatasyncSync,
  fstatSync,
  ftruncateSync,
  openSync,
  readFileSync,
  truncateSync,
  writeSync,
} from 'node:fs';
import type { JsonValue } from '../core/json.js';

/** One applied effect (the provider's record of it). */
export interface ProviderEffect {
  key: string;
  bodySha256: string;
  body: JsonValue;
  operationId: string;
  requestId: string;
  at: Date;
}

/** A recorded effect, or null when the line is not one (any field missing or malformed). */
function parseEffect(line: string): ProviderEffect | null {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch {
    return null;
  }
  if (typeof v !== 'object' || v === null) return null;
  const e = v as Record<string, unknown>;
  const texts = ['key', 'operationId', 'requestId', 'at'].every((f) => typeof e[f] === 'string' && e[f] !== '');
  if (!texts || typeof e.bodySha256 !== 'string' || !/^[0-9a-f]{64}$/.test(e.bodySha256) || !('body' in e)) return null;
  const at = new Date(e.at as string);
  if (Number.isNaN(at.getTime())) return null;
  return {
    key: e.key as string,
    bodySha256: e.bodySha256,
    body: e.body as JsonValue,
    operationId: e.operationId as string,
    requestId: e.requestId as string,
    at,
  };
}

export class EffectJournal {
  readonly path: string;
  #fd: number | null;

  /** Opens (creating) the journal at `path` for appending. */
  constructor(path: string) {
    this.path = path;
    this.#fd = openSync(path, 'a', 0o600);
  }

  /**
   * The effects recorded so far, oldest first. Throws `path:line` on a line that is not an effect, except the
   * last one when it has no newline: an append a crash cut short, dropped (its receipt was never sent). A last
   * line that is a whole effect missing only its newline is kept, and the newline written.
   */
  load(): ProviderEffect[] {
    const text = readFileSync(this.path, 'utf8');
    const lines = text.split('\n');
    const tail = lines.pop() ?? '';
    const effects = lines.map((line, i) => {
      const e = parseEffect(line);
      if (e === null) throw new Error(`${this.path}:${i + 1}: not a provider effect`);
      return e;
    });
    if (tail !== '') {
      const whole = parseEffect(tail);
      if (whole !== null) {
        effects.push(whole);
        this.#write('\n');
      } else truncateSync(this.path, Buffer.byteLength(text) - Buffer.byteLength(tail));
    }
    return effects;
  }

  /** Appends one effect and flushes it to disk before returning; throws when not all of it could be written. */
  append(effect: ProviderEffect): void {
    this.#write(`${JSON.stringify(effect)}\n`);
  }

  #write(text: string): void {
    if (this.#fd === null) throw new Error('effect journal closed');
    const bytes = Buffer.from(text);
    const before = fstatSync(this.#fd).size;
    try {
      // writeSync may write less than asked (a full disk, a file-size limit): write the rest, or fail the request.
      for (let done = 0; done < bytes.length;) {
        const n = writeSync(this.#fd, bytes, done, bytes.length - done);
        if (n <= 0) throw new Error(`${this.path}: short write`);
        done += n;
      }
      fdatasyncSync(this.#fd);
    } catch (err) {
      // No half line left for the next append to run into: the effect was not recorded, and is not applied.
      try {
        ftruncateSync(this.#fd, before);
      } catch {
        // the load drops a cut-off last line anyway
      }
      throw err;
    }
  }

  close(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
  }
}
