/**
 * Notifications: approval requests, decisions, reviews, kill switches and escalations delivered as signed
 * webhooks (Standard Webhooks) and Slack messages with Approve / Reject buttons bound to the envelope hash.
 * See docs/notifications.md.
 */
export { NotificationDelivery, routeMatches, type NotificationDeliveryOptions } from './delivery.js';
export {
  SlackInteractions,
  linkSlackUser,
  unlinkSlackUser,
  type SlackAnswer,
  type SlackInteractionsOptions,
} from './slack-interactions.js';
export {
  standardWebhookHeaders,
  slackSignature,
  verifySlackRequest,
  webhookSecret,
  SLACK_WINDOW_S,
} from './signing.js';
export { APPROVE_ACTION, REJECT_ACTION } from './render.js';
export { checkDestinations } from './transport.js';
