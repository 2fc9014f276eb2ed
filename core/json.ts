/**
 * Strict JSON: parsing that refuses what `JSON.parse` quietly accepts, and the RFC 8785 canonical form.
 *
 * `JSON.parse` keeps the last of duplicate keys, rounds 9007199254740993 down, keeps `__proto__` as an own key
 * and accepts lone surrogates. Every JSON that crosses a trust boundary (authorization decisions, provider
 * bodies, configuration, CLI arguments) goes through {@link parseStrictJson} instead. Text that passes every
 * check is parsed by `JSON.parse` and checked on the result (about 2 µs for a gate call's body); any text that
 * might not pass is parsed again by momoa's AST (a maintained parser that keeps duplicates and raw number text),
 * walked once, which names the problem and its path (about 25 µs: every HTTP request body used to pay it).
 */
import { createHash } from 'node:crypto';
import { parse as parseAst } from '@humanwhocodes/momoa';
import canonicalize from 'canonicalize';
import { ActionLedgerError } from './errors.js';

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
export type JsonObject = { [key: string]: JsonValue };

export interface JsonBounds {
  /** Deepest nesting allowed; the root object is depth 1. */
  maxDepth: number;
  /** Largest size in bytes of the canonical (or raw, when parsing) UTF-8 text. */
  maxBytes: number;
}

export const DEFAULT_JSON_BOUNDS: JsonBounds = Object.freeze({ maxDepth: 32, maxBytes: 1024 * 1024 });

type AstNode = {
  type: string;
  value?: unknown;
  members?: { name: { value: string }; value: AstNode }[];
  elements?: { value: AstNode }[];
  range?: [number, number];
};

function jsonError(message: string, path: string): ActionLedgerError {
  return new ActionLedgerError('invalid_json', `${message} at ${path}`, { details: { path } });
}

/**
 * Parses JSON text strictly: one value, no duplicate keys, no `__proto__` keys, no integers beyond 2^53 - 1,
 * no lone surrogates, within the size and depth bounds (the depth checked on the text before it is parsed, so no
 * nesting can exhaust the stack). With `requireObject`, the root must be an object. Throws `invalid_json` naming
 * the JSON path of the first problem.
 *
 * Two paths, one answer: text is first scanned once (nesting depth, members, long digit runs) and given to
 * `JSON.parse`, and its result is accepted only when nothing could differ from momoa's (every member kept, so no
 * duplicate collapsed; no digit run long enough to be an unsafe integer; no `__proto__`, lone surrogate, NUL or
 * infinite number in the result); otherwise momoa's path below decides and names the problem, so both the
 * values accepted and the errors thrown are those of the momoa path alone (test/core/json.test.ts compares them).
 */
export function parseStrictJson(
  text: string | Uint8Array,
  options: { bounds?: JsonBounds; requireObject?: boolean } = {},
): JsonValue {
  const bounds = options.bounds ?? DEFAULT_JSON_BOUNDS;
  const source = decodedWithin(text, bounds);
  const scan = scanText(source, bounds.maxDepth);
  if (!scan.longDigits) {
    const fast = parsedIfClean(source, scan.members, options.requireObject === true);
    if (fast !== undefined) return fast;
  }
  return parseWithAst(source, bounds, options.requireObject === true);
}

/** What one pass over the text saw outside strings (meaningful only for text that is JSON). */
interface TextScan {
  /** How many `:` (so object members, in JSON text). */
  members: number;
  /** Whether a run of 16 or more digits occurs: the only way to write an integer beyond 2^53 - 1. */
  longDigits: boolean;
}

/**
 * `JSON.parse`'s value of the text when it is strict JSON for certain, else undefined (not JSON, or a property
 * {@link parseStrictJson}'s momoa path must judge). The members counted in the text must all be in the result:
 * `JSON.parse` keeps the last of duplicate keys, so one fewer key means a duplicate.
 */
function parsedIfClean(source: string, members: number, requireObject: boolean): JsonValue | undefined {
  let value: unknown;
  try {
    value = JSON.parse(source);
  } catch {
    return undefined;
  }
  if (requireObject && (value === null || typeof value !== 'object' || Array.isArray(value))) return undefined;
  const count = { members: 0 };
  return cleanValue(value, count) && count.members === members ? (value as JsonValue) : undefined;
}

/** Whether a `JSON.parse` result holds no string, key or number the strict parse refuses; counts the keys. */
function cleanValue(value: unknown, count: { members: number }): boolean {
  switch (typeof value) {
    case 'string':
      return value.isWellFormed() && !value.includes('\u0000');
    case 'number':
      return Number.isFinite(value);
    case 'boolean':
      return true;
    default:
      break;
  }
  if (value === null) return true;
  if (Array.isArray(value)) {
    for (const el of value as unknown[]) if (!cleanValue(el, count)) return false;
    return true;
  }
  const obj = value as Record<string, unknown>;
  for (const key of Object.keys(obj)) {
    count.members++;
    if (key === '__proto__' || !key.isWellFormed() || key.includes('\u0000')) return false;
    if (!cleanValue(obj[key], count)) return false;
  }
  return true;
}

/**
 * {@link parseStrictJson} by momoa's path alone, every time: the reference its fast path must agree with, value
 * for value and error for error (test/core/json-paths.test.ts). Same bounds, options and `invalid_json` errors.
 */
export function parseStrictJsonByAst(
  text: string | Uint8Array,
  options: { bounds?: JsonBounds; requireObject?: boolean } = {},
): JsonValue {
  const bounds = options.bounds ?? DEFAULT_JSON_BOUNDS;
  const source = decodedWithin(text, bounds);
  scanText(source, bounds.maxDepth);
  return parseWithAst(source, bounds, options.requireObject === true);
}

/** The text of a JSON document within the byte bound; throws `invalid_json` over it or for bytes not UTF-8. */
function decodedWithin(text: string | Uint8Array, bounds: JsonBounds): string {
  if (typeof text === 'string') {
    if (Buffer.byteLength(text, 'utf8') > bounds.maxBytes) throw jsonError('text exceeds the byte bound', '$');
    return text;
  }
  if (text.byteLength > bounds.maxBytes) throw jsonError('text exceeds the byte bound', '$');
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(text);
  } catch (cause) {
    throw new ActionLedgerError('invalid_json', 'text is not valid UTF-8', { cause });
  }
}

/** The momoa path: parses to an AST and walks it, naming the first problem and its path. */
function parseWithAst(source: string, bounds: JsonBounds, requireObject: boolean): JsonValue {
  let doc: { body: AstNode };
  try {
    doc = parseAst(source, { ranges: true, mode: 'json' }) as unknown as { body: AstNode };
  } catch (cause) {
    throw new ActionLedgerError('invalid_json', `malformed JSON: ${(cause as Error).message}`, { cause });
  }
  if (requireObject && doc.body.type !== 'Object') throw jsonError('root must be an object', '$');
  return fromAst(doc.body, source, '$', 1, bounds.maxDepth);
}

/**
 * Throws `invalid_json` when the text nests arrays and objects deeper than `maxDepth`, before anything parses it:
 * one pass over the text, counting `[` and `{` outside strings (a backslash inside a string escapes the next
 * character), so a body nested 100,000 deep is refused in linear time and never reaches a recursive parser.
 * The same pass counts the `:` and the longest run of digits outside strings ({@link TextScan}). What is not
 * JSON is left to the parser to name.
 */
function scanText(source: string, maxDepth: number): TextScan {
  let depth = 0;
  let inString = false;
  let members = 0;
  let digits = 0;
  let longDigits = false;
  for (let i = 0; i < source.length; i++) {
    const c = source.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // backslash: the next character is escaped
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c >= 0x30 && c <= 0x39) {
      if (++digits >= 16) longDigits = true;
      continue;
    }
    digits = 0;
    if (c === 0x22) inString = true;
    else if (c === 0x3a) members++;
    else if (c === 0x5b || c === 0x7b) {
      depth++;
      if (depth > maxDepth)
        throw new ActionLedgerError(
          'invalid_json',
          `JSON nests arrays and objects more than ${maxDepth} deep (the limit here), at offset ${i}`,
          { details: { max_depth: maxDepth, offset: i } },
        );
    } else if ((c === 0x5d || c === 0x7d) && depth > 0) depth--;
  }
  return { members, longDigits };
}

function fromAst(node: AstNode, source: string, path: string, depth: number, maxDepth: number): JsonValue {
  switch (node.type) {
    case 'Null':
      return null;
    case 'Boolean':
      return node.value as boolean;
    case 'String': {
      const value = node.value as string;
      if (!value.isWellFormed()) throw jsonError('lone surrogate in string', path);
      if (value.includes('\u0000')) throw jsonError('NUL character in string (PostgreSQL jsonb cannot store it)', path);
      return value;
    }
    case 'Number': {
      const value = node.value as number;
      if (!Number.isFinite(value)) throw jsonError('number out of range', path);
      const raw = node.range === undefined ? '' : source.slice(node.range[0], node.range[1]);
      if (!/[.eE]/.test(raw) && !Number.isSafeInteger(value)) throw jsonError('integer beyond 2^53-1', path);
      return value;
    }
    case 'Array': {
      if (depth > maxDepth) throw jsonError('nesting exceeds the depth bound', path);
      return (node.elements ?? []).map((el, i) => fromAst(el.value, source, `${path}[${i}]`, depth + 1, maxDepth));
    }
    case 'Object': {
      if (depth > maxDepth) throw jsonError('nesting exceeds the depth bound', path);
      const out: JsonObject = Object.create(null) as JsonObject;
      for (const member of node.members ?? []) {
        const key = member.name.value;
        const childPath = `${path}.${key}`;
        if (!key.isWellFormed()) throw jsonError('lone surrogate in key', path);
        if (key.includes('\u0000')) throw jsonError('NUL character in key', path);
        if (key === '__proto__') throw jsonError('forbidden key __proto__', childPath);
        if (Object.prototype.hasOwnProperty.call(out, key)) throw jsonError('duplicate key', childPath);
        out[key] = fromAst(member.value, source, childPath, depth + 1, maxDepth);
      }
      return Object.setPrototypeOf(out, Object.prototype) as JsonObject;
    }
    default:
      throw jsonError(`unexpected ${node.type}`, path);
  }
}

function argsError(problem: string, path: string): ActionLedgerError {
  return new ActionLedgerError('invalid_arguments', `arguments ${problem} at ${path}`, { details: { problem, path } });
}

/**
 * Checks that a JavaScript value is plain JSON data (the shape `reserve` accepts) and returns its RFC 8785
 * canonical text. Refuses, with `invalid_arguments` naming the problem and path: a non-object root, NaN or
 * Infinity, undefined, functions, symbols, BigInt, class instances (Date, Map, Buffer, ...), sparse arrays,
 * `__proto__` keys, lone surrogates, nesting deeper than `maxDepth` and canonical text over `maxBytes`.
 */
export function canonicalArguments(value: unknown, bounds: JsonBounds): string {
  if (!isPlainObject(value)) throw argsError('must be one JSON object', '$');
  checkJsonData(value, '$', 1, bounds.maxDepth, new Set());
  const text = canonicalize(value);
  if (text === undefined) throw argsError('are not serialisable', '$');
  if (Buffer.byteLength(text, 'utf8') > bounds.maxBytes) throw argsError('exceed the size bound', '$');
  return text;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value) as unknown;
  return proto === Object.prototype || proto === null;
}

function checkJsonData(value: unknown, path: string, depth: number, maxDepth: number, seen: Set<object>): void {
  switch (typeof value) {
    case 'string':
      if (!value.isWellFormed()) throw argsError('contain a lone surrogate', path);
      if (value.includes('\u0000')) throw argsError('contain a NUL character', path);
      return;
    case 'number':
      if (!Number.isFinite(value)) throw argsError('contain a non-finite number', path);
      return;
    case 'boolean':
      return;
    case 'undefined':
      throw argsError('contain undefined', path);
    case 'function':
      throw argsError('contain a function', path);
    case 'bigint':
      throw argsError('contain a BigInt', path);
    case 'symbol':
      throw argsError('contain a symbol', path);
    default:
      break;
  }
  if (value === null) return;
  const obj = value as object;
  if (depth > maxDepth) throw argsError('nest deeper than the bound', path);
  if (seen.has(obj)) throw argsError('contain a cycle', path);
  seen.add(obj);
  if (Array.isArray(obj)) {
    for (let i = 0; i < obj.length; i++) {
      if (!(i in obj)) throw argsError('contain a sparse array', `${path}[${i}]`);
      checkJsonData(obj[i], `${path}[${i}]`, depth + 1, maxDepth, seen);
    }
  } else {
    if (!isPlainObject(obj)) throw argsError('contain a class instance', path);
    if (Object.getOwnPropertySymbols(obj).length > 0) throw argsError('contain a symbol key', path);
    for (const key of Object.keys(obj)) {
      const childPath = `${path}.${key}`;
      if (!key.isWellFormed()) throw argsError('contain a lone surrogate in a key', path);
      if (key.includes('\u0000')) throw argsError('contain a NUL character in a key', path);
      if (key === '__proto__') throw argsError('contain the key __proto__', childPath);
      checkJsonData(obj[key], childPath, depth + 1, maxDepth, seen);
    }
  }
  seen.delete(obj);
}

/** RFC 8785 canonical text of any JSON value (no checks: callers validate first). */
export function canonicalJson(value: JsonValue): string {
  const text = canonicalize(value);
  if (text === undefined) throw new ActionLedgerError('invalid_json', 'value is not serialisable');
  return text;
}

export function sha256Hex(data: string | Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}
