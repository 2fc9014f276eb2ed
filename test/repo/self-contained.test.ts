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

/** Numbered source articles ("seed" and three digits) and their guarantee ids (G and three digits) are outside too. */
const OUTSIDE_IDS = /\bseeds? \d{3}\b|\bG\d{3}\b/;

/** The outside documents `text` mentions. */
function outsideMentions(text: string): string[] {
  const ids = OUTSIDE_IDS.exec(text);
  return [...OUTSIDE.filter((name) => text.includes(name)), ...(ids === null ? [] : [ids[0]])];
}

/**
 * Migrations are exempt: an applied migration's bytes are pinned by its sha256 in every database it ran on
 * (db/migrate.ts), so its comments cannot be edited; the mentions in them stay.
 */
const PINNED = /^sql\/\d{4}_.*\.sql$/;

/** Images (the console's screenshots) are pixels, not text: their bytes can spell anything. */
const IMAGE = /\.(png|jpe?g|gif|webp)$/;

t.test('the check finds each outside document it looks for', (t) => {
  for (const name of OUTSIDE) t.same(outsideMentions(`see ${name}, section 2`), [name], name);
  t.same(outsideMentions('see docs/architecture.md'), [], 'a document of the repository is not outside');
  t.same(outsideMentions(`the envelope (${'seeds'} 001, 002)`), [`${'seeds'} 001`], 'a numbered article');
  t.same(outsideMentions(`one operation (${'G'}001)`), [`${'G'}001`], 'a guarantee id');
  t.same(outsideMentions('seed 7, 300 operations'), [], 'a chaos seed is not an article');
  t.end();
});

t.test('no tracked file mentions a document outside the repository', (t) => {
  const root = execFileSync('git', ['rev-parse', '--show-toplevel'], {
    cwd: dirname(fileURLToPath(import.meta.url)),
    encoding: 'utf8',
  }).trim();
  const files = execFileSync('git', ['ls-files', '-z'], { cwd: root, encoding: 'utf8' })
    .split('\0')
    .filter((f) => f !== '' && !/^(node_modules|dist)\//.test(f) && !PINNED.test(f) && !IMAGE.test(f));
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
