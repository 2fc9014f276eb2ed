import t from 'tap';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LAST_RUN_END, LAST_RUN_START, writeLastRun } from '../../bench/harness.js';

t.test('a benchmark run replaces only the last run in results.md and keeps the history after it', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-results-md-'));
  const path = join(dir, 'results.md');
  writeFileSync(path, '# Benchmark results\n\nOlder runs, written by hand.\n');

  writeLastRun(path, 'first run: 100 ops/s');
  const first = readFileSync(path, 'utf8');
  t.ok(first.startsWith(`${LAST_RUN_START}\n\nfirst run: 100 ops/s\n\n${LAST_RUN_END}`), first);
  t.ok(first.endsWith('Older runs, written by hand.\n'), 'a file without markers keeps what it had, below them');

  const history = first.replace(LAST_RUN_END, `${LAST_RUN_END}\n\n## History\n\nsecond run's notes`);
  writeFileSync(path, `# Results\n\n${history}`);
  writeLastRun(path, 'second run: 200 ops/s');
  const second = readFileSync(path, 'utf8');
  t.ok(second.startsWith(`# Results\n\n${LAST_RUN_START}\n\nsecond run: 200 ops/s\n\n${LAST_RUN_END}`), second);
  t.notOk(second.includes('first run'), 'the previous last run is gone');
  t.ok(second.includes("## History\n\nsecond run's notes"), 'the history after the markers is kept');
  t.ok(second.includes('Older runs, written by hand.'), 'and so is everything else');
  t.equal(second.split(LAST_RUN_START).length, 2, 'one last run');
  t.end();
});
