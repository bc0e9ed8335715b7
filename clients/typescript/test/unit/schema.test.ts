// src/protocol.ts is written by hand; docs/protocol.schema.json is generated from the
// server's Rust types. This test reads both (the TypeScript through the compiler's own
// type checker) and fails when a frame kind, a field or a field's required-ness is on
// one side only, so the client cannot drift from the server.

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { describe, expect, it } from "vitest";

const schemaFile = new URL("../../../../docs/protocol.schema.json", import.meta.url);
const protocolFile = fileURLToPath(new URL("../../src/protocol.ts", import.meta.url));

/** Field name to whether it is required. */
type Shape = Record<string, "required" | "optional">;

const schema = JSON.parse(readFileSync(schemaFile, "utf8"));

/** The properties of a schema, following `$ref` and `allOf`. */
function schemaShape(s: any, shape: Shape = {}): Shape {
  if (s.$ref) {
    const name = String(s.$ref).replace(/^#\/\$defs\//, "");
    const def = schema.$defs[name];
    if (!def) throw new Error(`unresolved ${s.$ref}`);
    schemaShape(def, shape);
  }
  for (const part of s.allOf ?? []) schemaShape(part, shape);
  for (const key of Object.keys(s.properties ?? {})) shape[key] ??= "optional";
  for (const key of s.required ?? []) shape[key] = "required";
  return shape;
}

/** Each frame kind (`t`) of a frame union in the schema, with its fields. */
function schemaFrames(name: string): Record<string, Shape> {
  const variants: any[] = schema.$defs[name]?.oneOf;
  if (!Array.isArray(variants)) throw new Error(`no oneOf in $defs.${name}`);
  return Object.fromEntries(
    variants.map((v) => {
      const shape = schemaShape(v);
      const t = v.properties?.t?.const ?? schema.$defs[v.$ref?.replace(/^#\/\$defs\//, "")]?.properties?.t?.const;
      if (typeof t !== "string") throw new Error(`a ${name} variant without a const t: ${JSON.stringify(v)}`);
      return [t, shape];
    }),
  );
}

const program = ts.createProgram([protocolFile], {
  strict: true,
  noEmit: true,
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
  skipLibCheck: true,
  types: [],
});
const checker = program.getTypeChecker();
const exported = checker.getExportsOfModule(checker.getSymbolAtLocation(program.getSourceFile(protocolFile)!)!);

function tsType(name: string): ts.Type {
  const symbol = exported.find((s) => s.name === name);
  if (!symbol) throw new Error(`protocol.ts exports no ${name}`);
  return checker.getDeclaredTypeOfSymbol(symbol);
}

function tsShape(type: ts.Type): Shape {
  const shape: Shape = {};
  for (const p of checker.getPropertiesOfType(type)) {
    shape[p.name] = p.flags & ts.SymbolFlags.Optional ? "optional" : "required";
  }
  return shape;
}

/** Each member of a TypeScript frame union by its `t`, with its fields. */
function tsFrames(name: string): Record<string, Shape> {
  const type = tsType(name);
  const members = type.isUnion() ? type.types : [type];
  return Object.fromEntries(
    members.map((m) => {
      const t = m.getProperty("t");
      const tType = t && checker.getTypeOfSymbol(t);
      if (!tType?.isStringLiteral()) throw new Error(`a ${name} member without a literal t: ${checker.typeToString(m)}`);
      return [tType.value, tsShape(m)];
    }),
  );
}

describe("protocol.ts against docs/protocol.schema.json", () => {
  for (const name of ["ServerFrame", "ClientFrame"]) {
    it(`${name} has the schema's frame kinds, fields and required fields`, () => {
      const fromSchema = schemaFrames(name);
      expect(Object.keys(fromSchema).length).toBeGreaterThan(5);
      expect(tsFrames(name)).toEqual(fromSchema);
    });
  }

  it("WireMessage is the schema's Message", () => {
    expect(tsShape(tsType("WireMessage"))).toEqual(schemaShape(schema.$defs.Message));
  });

  it("TimelineEvent has the schema's event types and fields", () => {
    const fromSchema = Object.fromEntries(
      (schema.$defs.TimelineEvent.oneOf as any[]).map((v) => [v.properties.type.const, schemaShape(v)]),
    );
    const type = tsType("TimelineEvent");
    const fromTs = Object.fromEntries(
      (type.isUnion() ? type.types : [type]).map((m) => {
        const t = checker.getTypeOfSymbol(m.getProperty("type")!);
        return [t.isStringLiteral() ? t.value : "?", tsShape(m)];
      }),
    );
    expect(Object.keys(fromSchema).length).toBe(7);
    expect(fromTs).toEqual(fromSchema);
  });

  it("ErrorCode has the schema's codes", () => {
    const type = tsType("ErrorCode");
    const codes = (type.isUnion() ? type.types : [type]).map((t) => (t.isStringLiteral() ? t.value : "?"));
    expect(codes.sort()).toEqual([...schema.$defs.ErrorCode.enum].sort());
  });
});
