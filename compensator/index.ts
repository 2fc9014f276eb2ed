export {
  Compensator,
  compareSteps,
  nextToCompensate,
  type CompensationSummary,
  type CompensatorOptions,
} from './compensator.js';
export { compensationArguments, resolvePointer } from './mapping.js';
