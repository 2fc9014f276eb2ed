/**
 * `npm test` starts the longest files first, by the durations of this checkout's last run or, on a fresh clone,
 * by the ones committed in test/durations.json (test/runner.ts). A file missing there starts after every listed
 * one: a long one missing ran last on a fresh clone and lengthened the whole run. Every test file is listed, and
 * nothing listed is gone; after a full run, `cp .tap/durations.json test/durations.json` brings the list up to date.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { testFiles } from '../runner.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

t.test('every test file has a committed duration, and every committed duration a test file', (t) => {
  const committed = JSON.parse(readFileSync(join(ROOT, 'test', 'durations.json'), 'utf8')) as Record<string, number>;
  const files = testFiles(join(ROOT, 'dist', 'test')).map((f) => f.slice(ROOT.length));
  t.ok(files.length > 100, `${files.length} test files`);
  t.same(
    files.filter((f) => !Object.hasOwn(committed, f)),
    [],
    'not in test/durations.json (cp .tap/durations.json test/durations.json after a full run)',
  );
  t.same(
    Object.keys(committed).filter((f) => !files.includes(f)),
    [],
    'in test/durations.json, but no such test file',
  );
  t.ok(
    Object.values(committed).every((s) => typeof s === 'number' && s >= 0),
    'each a number of seconds',
  );
  t.end();
});
