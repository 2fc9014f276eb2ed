/**
 * The problems found in a configuration, collected in one pass and reported together in one `config_invalid`
 * error: each has a JSON pointer into the file, a message, and where it helps the offending value, the values
 * allowed there and the nearest one (`did you mean`). The schema step also records which parts failed it, so
 * the later steps skip exactly those parts (nothing runs on a malformed value) and check the rest.
 */
import { ActionLedgerError } from './errors.js';

export interface ConfigProblem {
  /** A JSON pointer into the configuration (`/gate/tools/x/approval/mode`), or an environment variable's name. */
  readonly path: string;
  readonly message: string;
  /** The offending value, when it is a scalar worth quoting back. */
  readonly got?: string | number | boolean | null;
  readonly allowed?: readonly unknown[];
  readonly suggestion?: string;
}

export type ProblemExtra = Omit<ConfigProblem, 'path' | 'message'>;

/** Escapes one JSON pointer segment (RFC 6901). */
const escapeSegment = (s: string | number): string => String(s).replaceAll('~', '~0').replaceAll('/', '~1');

/** A JSON pointer from its segments: `pointer('tools', 'a/b')` is `/tools/a~1b`. */
export function pointer(...segments: (string | number)[]): string {
  return segments.map((s) => `/${escapeSegment(s)}`).join('');
}

export function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

export class ConfigProblems {
  readonly list: ConfigProblem[] = [];
  readonly #malformed: string[] = [];

  get length(): number {
    return this.list.length;
  }

  add(path: string, message: string, extra: ProblemExtra = {}): void {
    const p: { -readonly [K in keyof ConfigProblem]: ConfigProblem[K] } = { path, message };
    if (extra.got !== undefined) p.got = extra.got;
    if (extra.allowed !== undefined) p.allowed = extra.allowed;
    if (extra.suggestion !== undefined) p.suggestion = extra.suggestion;
    this.list.push(p);
  }

  /** Records that the value at `at` failed the schema: the later steps must not read it. */
  markMalformed(at: string): void {
    this.#malformed.push(at);
  }

  /** True when the value at `at`, a value inside it, or a value holding it failed the schema. */
  malformed(at: string): boolean {
    return this.#malformed.some((m) => m === at || m.startsWith(`${at}/`) || at.startsWith(`${m}/`));
  }

  /** The one `config_invalid` error listing every problem; `file` names the configuration file read. */
  error(file: string | null = null): ActionLedgerError {
    return configInvalid(this.list, file);
  }
}

function configInvalid(issues: readonly ConfigProblem[], file: string | null): ActionLedgerError {
  const problems = issues.map(problemLine);
  const where = file === null ? 'configuration' : `configuration ${file}`;
  return new ActionLedgerError('config_invalid', `${where} is invalid:\n  - ${problems.join('\n  - ')}`, {
    details: { ...(file === null ? {} : { file }), problems, issues },
  });
}

/** `(got "alwyas"; did you mean "always"?)`, or empty. */
function suffix(p: ConfigProblem): string {
  const parts: string[] = [];
  if (p.got !== undefined) parts.push(`got ${JSON.stringify(p.got)}`);
  if (p.suggestion !== undefined) parts.push(`did you mean ${JSON.stringify(p.suggestion)}?`);
  return parts.length === 0 ? '' : ` (${parts.join('; ')})`;
}

/** The problem as one line with its JSON pointer: `/gate/direct_reservations must be one of: allow, deny (...)`. */
export function problemLine(p: ConfigProblem): string {
  return `${p.path === '' ? '(root)' : p.path} ${p.message}${suffix(p)}`;
}

/** A JSON pointer as a person reads it: `/gate/tools/x/resources/0` is `gate.tools.x.resources[0]`. */
export function dottedPath(path: string): string {
  if (path === '') return '(root)';
  if (!path.startsWith('/')) return path;
  const segments = path
    .slice(1)
    .split('/')
    .map((s) => s.replaceAll('~1', '/').replaceAll('~0', '~'));
  return segments
    .map((s, i) =>
      /^[0-9]+$/.test(s)
        ? `[${s}]`
        : /^[A-Za-z_$][A-Za-z0-9_$-]*$/.test(s)
          ? `${i === 0 ? '' : '.'}${s}`
          : `[${JSON.stringify(s)}]`,
    )
    .join('');
}

/**
 * A `config_invalid` error as text for a terminal: a heading, then one line per problem
 * (`  gate.direct_reservations: must be one of: allow, deny (got "maybe")`). Null for any other error.
 */
export function configProblemsText(err: ActionLedgerError): string | null {
  const issues = err.code === 'config_invalid' ? err.details?.issues : undefined;
  if (!Array.isArray(issues) || issues.length === 0) return null;
  const file = err.details?.file;
  const n = issues.length;
  const heading = `configuration${typeof file === 'string' ? ` ${file}` : ''} is invalid (${n} problem${n === 1 ? '' : 's'}):`;
  const lines = (issues as ConfigProblem[]).map((p) =>
    p.path === '' ? `  ${p.message}${suffix(p)}` : `  ${dottedPath(p.path)}: ${p.message}${suffix(p)}`,
  );
  return `${heading}\n${lines.join('\n')}\n`;
}

/**
 * Edit distance with adjacent transpositions counted as one edit (optimal string alignment), so `alwyas` is
 * one edit from `always` and `dispach` one from `dispatch`.
 */
export function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) =>
    Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)),
  );
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      const row = d[i]!;
      row[j] = Math.min(d[i - 1]![j]! + 1, row[j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        row[j] = Math.min(row[j]!, d[i - 2]![j - 2]! + 1);
    }
  }
  return d[a.length]![b.length]!;
}

/**
 * The candidate nearest to `word` (case ignored), when it is close enough to be the likely intent: at most a
 * third of the longer word's length in edits, and one for short words (`dispach` is three from `dispatcher`,
 * `k2` one from `k1`, `bogus` near nothing). The first of equally near candidates wins; undefined when none is
 * close or `word` is itself a candidate.
 */
export function nearest(word: string, candidates: Iterable<string>): string | undefined {
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const c of candidates) {
    if (c === word) return undefined;
    const distance = editDistance(word.toLowerCase(), c.toLowerCase());
    const limit = Math.max(1, Math.floor(Math.max(word.length, c.length) / 3));
    if (distance <= limit && distance < bestDistance) {
      best = c;
      bestDistance = distance;
    }
  }
  return best;
}
