// Package grammar keeps a generation inside a grammar: JSON (any object,
// or what a JSON Schema accepts) and literal text around it, as the
// OpenAI API's response_format and forced tool calls ask.
//
// A grammar is a graph of Nodes (FromSchema, AnyObject, Literal, Seq,
// OneOf, OneOrMore). It runs as a pushdown automaton over bytes: a state
// is a set of stacks of frames, immutable and sharing their tails, one
// stack for every way the bytes so far can be read (an anyOf, an
// optional property, a number that may end). A Constraint walks a
// tokenizer's vocabulary, sorted by bytes so that tokens sharing a prefix
// share its steps, and allows the tokens whose bytes the automaton can
// consume, and an end-of-sequence token once the grammar is complete;
// masks are kept per state, so that the tokens inside one long string
// cost one walk.
//
// What a grammar may cost is bounded before it runs: FromSchema parses
// a schema once and compiles each definition once, within Limits counted
// as it goes (a refusal names the limit and the schema's path), and New
// refuses a grammar whose steps could not be bounded (check). As it
// runs, a state keeps at most maxStacks ways to read the output.
//
// Whitespace: up to 24 bytes of spaces, tabs and newlines after '{',
// '[', ',' and ':' and after every value inside a container, none
// before the first value or after the last, so that a model can neither
// pad forever nor wander before it starts.
package grammar
