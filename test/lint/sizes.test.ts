/**
 * The size rules for shipped code (eslint.config.js: `max-lines` 400 and `max-lines-per-function` 80, blank
 * lines and comments not counted), run through eslint's Node API with the repository's own configuration: a
 * long function in a component is reported, the same function in a test is not, and an exception names its
 * reason on the line before it.
 */
import t from 'tap';
import { fileURLToPath } from 'node:url';
import { ESLint } from 'eslint';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const RULES = new Set(['max-lines', 'max-lines-per-function']);
const eslint = new ESLint({
  cwd: ROOT,
  ruleFilter: ({ ruleId }) => RULES.has(ruleId),
  overrideConfig: { languageOptions: { parserOptions: { projectService: false } } },
});

async function findings(path: string, code: string): Promise<string[]> {
  const [result] = await eslint.lintText(code, { filePath: `${ROOT}${path}` });
  if (result === undefined) throw new Error('eslint returned no result');
  return result.messages.map((m) => m.ruleId ?? `fatal: ${m.message}`);
}

/** A function of `statements` + 4 lines of code, with blank lines and comments between. */
function longFunction(statements: number): string {
  const body = Array.from({ length: statements }, (_, i) => `  total += ${i};\n\n  // step ${i}`).join('\n');
  return `export function long(): number {\n  let total = 0;\n${body}\n  return total;\n}\n`;
}

t.test(
  'a function over 80 lines of code in a component is reported; blank lines and comments do not count',
  async (t) => {
    t.same(await findings('gate/size-probe.ts', longFunction(76)), [], '80 lines of code: allowed');
    t.same(await findings('gate/size-probe.ts', longFunction(77)), ['max-lines-per-function'], '81: reported');
  },
);

t.test('a file over 400 lines of code in a component is reported', async (t) => {
  const code = Array.from({ length: 401 }, (_, i) => `export const c${i} = ${i};`).join('\n') + '\n';
  t.same(await findings('core/size-probe.ts', code), ['max-lines']);
  t.same(await findings('core/size-probe.ts', code.split('\n').slice(1).join('\n')), [], '400 lines: allowed');
});

t.test('tests, benchmarks and the chaos run are exempt', async (t) => {
  for (const dir of ['test', 'bench', 'chaos'])
    t.same(await findings(`${dir}/size-probe.ts`, longFunction(200)), [], dir);
});

t.test('an exception with its reason on the line before passes', async (t) => {
  const code = `// eslint-disable-next-line max-lines-per-function -- one sequence, read top to bottom\n${longFunction(100)}`;
  t.same(await findings('reconciler/size-probe.ts', code), []);
});
