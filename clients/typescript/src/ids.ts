// Message ids are 64-bit snowflakes written as decimal strings: above 2^53, so never a
// JavaScript number (docs/protocol.md, Conventions). Compare them as unsigned integers.

/** A message id: a string of decimal digits. */
export type MessageId = string;

const DIGITS = /^[0-9]{1,20}$/;

/** Whether `v` is a well-formed message id. */
export function isMessageId(v: unknown): v is MessageId {
  return typeof v === "string" && DIGITS.test(v);
}

function strip(id: string): string {
  let i = 0;
  while (i < id.length - 1 && id.charCodeAt(i) === 48) i++;
  return i === 0 ? id : id.slice(i);
}

/** Orders two ids as unsigned 64-bit integers: negative, zero or positive. */
export function compareIds(a: MessageId, b: MessageId): number {
  const x = strip(a);
  const y = strip(b);
  if (x.length !== y.length) return x.length - y.length;
  return x < y ? -1 : x > y ? 1 : 0;
}
