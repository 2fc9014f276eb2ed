/**
 * The repository stands alone: no tracked file may point a reader at a document that lives outside it. The
 * names are assembled here, so this file does not mention them itself.
 */
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const OUTSIDE = [...['DESIGN', 'PERFORMANCE', 'STYLE', 'FAULTS'].map((n) => `${n}.md`), `../${'shared'}`];

/** The outside documents `text` mentions. */
function outsideMentions(text: string): string[] {
  return OUTSIDE.filter((name) => text.includes(name));
}

t.test('the check finds each outside document it looks for', (t) => {
  for (const name of OUTSIDE) t.same(outsideMentions(`see ${name}, section 2`), [name], name);
  t.same(outsideMentions('see docs/architecture.md'), [], 'a document of the repository is not outside');
  t.end();
});

t.test('no tracked file mentions a document outside the repository', (t) => {
  const root = execFileSync('git', ['rev-parse', '--show-toplevel'], {
    cwd: dirname(fileURLToPath(import.meta.url)),
    encoding: 'utf8',
  }).trim();
  const files = execFileSync('git', ['ls-files', '-z'], { cwd: root, encoding: 'utf8' })
    .split('\0')
    .filter((f) => f !== '' && !/^(node_modules|dist)\//.test(f));
  t.ok(files.length > 50, `${files.length} tracked files`);
  const found: string[] = [];
  for (const file of files) {
    let text: string;
    try {
      text = readFileSync(join(root, file), 'utf8');
    } catch {
      continue; // listed but deleted in the working tree
    }
    text.split('\n').forEach((line, i) => {
      for (const name of outsideMentions(line)) found.push(`${file}:${i + 1} mentions ${name}`);
    });
  }
  t.same(found, [], 'every mention, as file:line');
  t.end();
});
