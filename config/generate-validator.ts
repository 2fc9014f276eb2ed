/** `npm run generate`: writes config/validator.generated.ts from the configuration schema as it stands. */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { configValidatorSource, GENERATED_VALIDATOR_PATH } from './validator-source.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
writeFileSync(join(root, GENERATED_VALIDATOR_PATH), configValidatorSource());
process.stdout.write(`wrote ${GENERATED_VALIDATOR_PATH}\n`);
