// @ts-check
import { readdirSync } from 'node:fs';
import { dirname, isAbsolute, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import tseslint from 'typescript-eslint';

const ROOT = dirname(fileURLToPath(import.meta.url));

/** Top-level folders that hold TypeScript but are not components (core/ is shared infrastructure, under a rule of its own). */
export const NOT_COMPONENTS = new Set(['core', 'test', 'bench', 'chaos']);

/** @param {string} dir @returns {boolean} whether any file under `dir` is TypeScript source */
function holdsTypeScript(dir) {
  return readdirSync(dir, { withFileTypes: true }).some((e) =>
    e.isDirectory() ? holdsTypeScript(join(dir, e.name)) : e.name.endsWith('.ts') && !e.name.endsWith('.d.ts'),
  );
}

/**
 * The components: every top-level folder of the repository that holds TypeScript, except the ones above.
 * Derived from the folders, not listed, so a new folder is a component (reached only through its index.ts)
 * from its first file on.
 */
export const COMPONENTS = new Set(
  readdirSync(ROOT, { withFileTypes: true })
    .filter((e) => e.isDirectory() && !e.name.startsWith('.') && !['node_modules', 'dist'].includes(e.name))
    .map((e) => e.name)
    .filter((name) => !NOT_COMPONENTS.has(name) && holdsTypeScript(join(ROOT, name))),
);

/**
 * `local/component-boundaries`: a file may import another component only through that component's `index.js`,
 * and a file in `core/` (shared infrastructure) may import no component at all. Relative specifiers are
 * resolved against the importing file, so `../dispatcher/queries.js` and `../../dispatcher/queries.js` are
 * judged by where they land, not by how they are spelled. Covers static imports, `export ... from`, dynamic
 * `import()` with a literal and `import('...')` types.
 *
 * @type {import('eslint').Rule.RuleModule}
 */
const componentBoundaries = {
  meta: {
    type: 'problem',
    docs: { description: "Forbid imports of another component's files other than its index" },
    schema: [],
    messages: {
      deep: "'{{source}}' reaches into {{target}}/ internals: import {{target}}/index.js, or move the shared piece to core/",
      core: "'{{source}}' imports the {{target}} component from core/: core/ is shared infrastructure and imports no component",
    },
  },
  create(context) {
    const own = relative(ROOT, context.filename).split(sep)[0];
    /** @param {import('estree').Node} node @param {unknown} source */
    function check(node, source) {
      if (typeof source !== 'string' || !source.startsWith('.')) return;
      const rel = relative(ROOT, resolve(dirname(context.filename), source));
      if (rel.startsWith('..') || isAbsolute(rel)) return;
      const [target, ...rest] = rel.split(sep);
      if (target === undefined || !COMPONENTS.has(target) || target === own) return;
      if (own === 'core') context.report({ node, messageId: 'core', data: { source, target } });
      else if (rest.join('/') !== 'index.js') context.report({ node, messageId: 'deep', data: { source, target } });
    }
    /** @param {any} node */
    const fromSource = (node) => {
      if (node.source != null) check(node, node.source.value);
    };
    return {
      ImportDeclaration: fromSource,
      ExportNamedDeclaration: fromSource,
      ExportAllDeclaration: fromSource,
      /** @param {any} node */
      ImportExpression(node) {
        if (node.source.type === 'Literal') check(node, node.source.value);
      },
      /** @param {any} node */
      TSImportType(node) {
        check(node, node.source?.value ?? node.argument?.literal?.value);
      },
    };
  },
};

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', '.actionledger/**', 'coverage/**', 'config/validator.generated.ts'] },
  ...tseslint.configs.recommendedTypeChecked,
  {
    files: ['**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: ROOT } },
  },
  {
    rules: {
      // Every promise is awaited, returned or deliberately voided; none is passed where a callback returns void.
      '@typescript-eslint/no-floating-promises': [
        'error',
        // tap queues a subtest when `t.test` is called and awaits it before the parent ends.
        { allowForKnownSafePromises: [{ from: 'package', name: 'PromiseWithSubtest', package: '@tapjs/core' }] },
      ],
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_' },
      ],
      '@typescript-eslint/no-non-null-assertion': 'off',
      'no-control-regex': 'off',
    },
  },
  {
    // Tests, benchmarks and the chaos run may open any file (a component's queries, a helper); shipped code may not.
    files: ['**/*.ts', '**/*.js'],
    ignores: ['test/**', 'bench/**', 'chaos/**'],
    plugins: { local: { rules: { 'component-boundaries': componentBoundaries } } },
    rules: {
      'local/component-boundaries': 'error',
      // Shipped code stays readable in one sitting: a file over 400 lines is two concerns, a function over 80
      // is several steps. An exception says why on the line before it (eslint-disable-next-line ... -- why).
      'max-lines': ['error', { max: 400, skipBlankLines: true, skipComments: true }],
      'max-lines-per-function': ['error', { max: 80, skipBlankLines: true, skipComments: true }],
    },
  },
  // The config files and the build step are plain JavaScript outside the TypeScript project: no type-aware rules.
  { files: ['**/*.js', '**/*.mjs'], ...tseslint.configs.disableTypeChecked },
  { files: ['**/*.mjs'], languageOptions: { globals: { process: 'readonly' } } },
);
