/**
 * The sandbox provider's memory on disk: one JSON line per applied effect, appended and flushed before the
 * receipt goes out, read back when the provider starts. With it, `npm start` after a restart still knows every
 * refund it applied, so readback and `verify` see the same effects as before (a real provider does not forget).
 *
 * A line cut short by a crash mid-append is dropped on load: its receipt was never sent, so the dispatcher saw
 * no answer, and readback saying "not applied" is the truth the provider now has.
 */
import { closeSync, fdatasyncSync, openSync, readFileSync, truncateSync, writeSync } from 'node:fs';
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

function isEffect(v: unknown): v is Omit<ProviderEffect, 'at'> & { at: string } {
  if (typeof v !== 'object' || v === null) return false;
  const e = v as Record<string, unknown>;
  return ['key', 'bodySha256', 'operationId', 'requestId', 'at'].every((f) => typeof e[f] === 'string') && 'body' in e;
}

export class EffectJournal {
  readonly path: string;
  #fd: number | null;

  /** Opens (creating) the journal at `path` for appending. */
  constructor(path: string) {
    this.path = path;
    this.#fd = openSync(path, 'a', 0o600);
  }

  /** The effects recorded so far, oldest first. Throws on a line that is not an effect, except a cut-off last one. */
  load(): ProviderEffect[] {
    const text = readFileSync(this.path, 'utf8');
    const lines = text.split('\n');
    // Everything before the last newline is complete; what follows it is a cut-off append (or nothing), cut
    // away so the next append starts on a line of its own.
    const cut = lines.pop() ?? '';
    if (cut !== '') truncateSync(this.path, Buffer.byteLength(text) - Buffer.byteLength(cut));
    return lines.map((line, i) => {
      const parsed: unknown = JSON.parse(line);
      if (!isEffect(parsed)) throw new Error(`${this.path}:${i + 1}: not a provider effect`);
      return { ...parsed, at: new Date(parsed.at) };
    });
  }

  /** Appends one effect and flushes it to disk before returning. */
  append(effect: ProviderEffect): void {
    if (this.#fd === null) throw new Error('effect journal closed');
    writeSync(this.#fd, `${JSON.stringify(effect)}\n`);
    fdatasyncSync(this.#fd);
  }

  close(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
  }
}
