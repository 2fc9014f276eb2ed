import { inspect } from 'node:util';

/**
 * A secret value that never prints: JSON, `util.inspect`, template strings and pino all see `[redacted]`.
 * Read the bytes with {@link Secret.reveal} only at the point of use (an HMAC, an Authorization header).
 */
export class Secret {
  readonly #bytes: Buffer;

  constructor(bytes: Buffer) {
    this.#bytes = Buffer.from(bytes);
  }

  reveal(): Buffer {
    return this.#bytes;
  }

  get byteLength(): number {
    return this.#bytes.byteLength;
  }

  toString(): string {
    return '[redacted]';
  }

  toJSON(): string {
    return '[redacted]';
  }

  [inspect.custom](): string {
    return 'Secret([redacted])';
  }
}
