// Package stage runs the later layers of a staged model on other nodes,
// so that no node holds every layer (issue 53): a first stage holds the
// embedding, its own layers and the output head, and has each pass's
// rows run through the stages that hold the rest, in turn, as its
// model.LayerRunner (Client); a stage (Serve) holds its layers and their
// KV rows of every sequence, runs a pass's rows through them and hands
// the rows back, with each layer's routing as it is routed.
//
// A stage keeps no state a first stage must tell it apart from its rows:
// a run says where each sequence's rows begin (its rows from there on
// are forgotten first: a rewind), a sequence's KV alignment reaches its
// layers as StageKV, its end as StageEnd, all in the order the first
// stage made them. The stages compute exactly what one process running
// every layer computes.
package stage
