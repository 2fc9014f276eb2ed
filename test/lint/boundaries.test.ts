/**
 * The component boundary rule (eslint.config.js, `local/component-boundaries`), run through eslint's Node API
 * with the repository's own configuration: a component (every top-level folder with TypeScript, derived from
 * the folders) reaches another only through its `index.js`, core/ imports no component, and test/, bench/ and
 * chaos/ are exempt. The shipped tree itself is linted with the rule by `npm run lint` (a step of `npm run check`),
 * not again here.
 */
import t from 'tap';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ESLint } from 'eslint';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const RULE = 'local/component-boundaries';
// Only the boundary rule runs, and it needs no type information: the probes are text, not files of the project.
const eslint = new ESLint({
  cwd: ROOT,
  ruleFilter: ({ ruleId }) => ruleId === RULE,
  overrideConfig: { languageOptions: { parserOptions: { projectService: false } } },
});

/** The boundary findings for `code` as if it were the file at `path` (relative to the repository root). */
async function findings(path: string, code: string): Promise<string[]> {
  const [result] = await eslint.lintText(code, { filePath: `${ROOT}${path}` });
  if (result === undefined) throw new Error('eslint returned no result');
  return result.messages.map((m) => `${m.ruleId ?? 'fatal'}: ${m.message}`);
}

t.test("a component importing another component's internal file is reported", async (t) => {
  const found = await findings(
    'reconciler/boundary-probe.ts',
    "import { dispatcherQueries } from '../dispatcher/queries.js';\nexport const q = dispatcherQueries;\n",
  );
  t.equal(found.length, 1, 'one finding');
  t.match(found[0], `${RULE}: '../dispatcher/queries.js' reaches into dispatcher/ internals`);
});

t.test("importing another component's index.js, core/ or a file of one's own component passes", async (t) => {
  const code = [
    "import { openDispatcher } from '../dispatcher/index.js';",
    "import { ActionLedgerError } from '../core/errors.js';",
    "import { reviewQueries } from './queries.js';",
    'export const all = [openDispatcher, ActionLedgerError, reviewQueries];',
    '',
  ].join('\n');
  t.same(await findings('reconciler/boundary-probe.ts', code), []);
});

t.test('every form of import is judged by where it lands, at any depth', async (t) => {
  const cases: Array<[string, string]> = [
    ['bin/commands/probe.ts', "import { Ledger } from '../../ledger/reserve.js';\nexport { Ledger };\n"],
    ['gate/probe.ts', "export { verifyLedger } from '../reconciler/verify.js';\n"],
    ['server/probe.ts', "export * from '../compensator/mapping.js';\n"],
    ['bin/probe.ts', "export const load = () => import('../sandbox/dev.js');\n"],
    ['compensator/probe.ts', "export type P = import('../ledger/inspect.js').LedgerStatus;\n"],
  ];
  for (const [path, code] of cases) {
    const found = await findings(path, code);
    t.equal(found.length, 1, `${path}: ${code.trim()}`);
    t.match(found[0], `${RULE}:`, path);
  }
});

t.test('core/ may import no component, not even its index', async (t) => {
  const found = await findings('core/probe.ts', "import { Ledger } from '../ledger/index.js';\nexport { Ledger };\n");
  t.equal(found.length, 1);
  t.match(found[0], 'imports the ledger component from core/');
});

t.test('the components the re-cut made of core/ are components like any other', async (t) => {
  const deep = await findings(
    'ledger/probe.ts',
    "import { loadConfig } from '../config/load.js';\nexport { loadConfig };\n",
  );
  t.equal(deep.length, 1, 'a component reaching into config/');
  t.match(deep[0], `${RULE}: '../config/load.js' reaches into config/ internals`);
  const fromCore = await findings(
    'core/probe.ts',
    "import { createPool } from '../db/index.js';\nexport { createPool };\n",
  );
  t.equal(fromCore.length, 1, 'core/ importing db/ through its index');
  t.match(fromCore[0], 'imports the db component from core/');
  t.same(
    await findings('ledger/probe.ts', "import { createPool } from '../db/index.js';\nexport { createPool };\n"),
    [],
  );
});

t.test('the component list is derived from the folders: each top-level folder with TypeScript is one', async (t) => {
  const { COMPONENTS, NOT_COMPONENTS } = (await import(`${ROOT}eslint.config.js`)) as {
    COMPONENTS: Set<string>;
    NOT_COMPONENTS: Set<string>;
  };
  const folders = readdirSync(ROOT, { withFileTypes: true })
    .filter((e) => e.isDirectory() && !e.name.startsWith('.') && !['node_modules', 'dist'].includes(e.name))
    .map((e) => e.name)
    .filter((name) => readdirSync(join(ROOT, name), { recursive: true }).some((f) => String(f).endsWith('.ts')));
  t.ok(folders.length > 15, `${folders.length} folders hold TypeScript`);
  for (const name of folders) {
    if (NOT_COMPONENTS.has(name)) continue;
    t.ok(COMPONENTS.has(name), `${name}/ is a component`);
  }
  t.same([...NOT_COMPONENTS].sort(), ['bench', 'chaos', 'core', 'test'], 'only these are exempt');
});

t.test('test/, bench/ and chaos/ may open any file', async (t) => {
  for (const path of ['test/dispatcher/probe.test.ts', 'bench/probe.ts', 'chaos/probe.ts']) {
    const depth = path.split('/').length - 1;
    const code = `import { dispatcherQueries } from '${'../'.repeat(depth)}dispatcher/queries.js';\nexport const q = dispatcherQueries;\n`;
    t.same(await findings(path, code), [], path);
  }
});
