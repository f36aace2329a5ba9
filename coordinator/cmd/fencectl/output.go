package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// view is what a command prints, in the one rendering layer every command goes through: -o json
// and -o yaml render data; -o table renders tables (or text, for what is not a table).
type view struct {
	// data is a protobuf message, an object, or any value encoding/json takes.
	data any
	// tables are printed one after the other, a blank line between them.
	tables []table
	// text, if set, is printed after the tables.
	text func(w io.Writer) error
}

// table is a header row and rows; notes are lines printed under it.
type table struct {
	title  string
	header []string
	rows   [][]string
	notes  []string
}

// object is a JSON object whose keys keep their order; values are rendered as data is.
type object []member

// member is one key of an object.
type member struct {
	key   string
	value any
}

// MarshalJSON renders the object with its keys in order.
func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		v, err := jsonValue(m.value)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// jsonValue renders a value as JSON: protobuf messages as protojson (the names grpcurl shows).
func jsonValue(v any) ([]byte, error) {
	if m, ok := v.(proto.Message); ok {
		if isNilMessage(m) {
			return []byte("null"), nil
		}
		return protojson.Marshal(m)
	}
	return json.Marshal(v)
}

func isNilMessage(m proto.Message) bool { return m == nil || !m.ProtoReflect().IsValid() }

// show prints v in the format -o asks for.
func (c *ctl) show(v view) error {
	switch c.output {
	case "json", "yaml":
		b, err := jsonValue(v.data)
		if err != nil {
			return err
		}
		if c.output == "yaml" {
			if b, err = yaml.JSONToYAML(b); err != nil {
				return err
			}
			_, err = c.out.Write(b)
			return err
		}
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, b, "", "  "); err != nil {
			return err
		}
		pretty.WriteByte('\n')
		_, err = c.out.Write(pretty.Bytes())
		return err
	}
	for i, t := range v.tables {
		if i > 0 {
			fmt.Fprintln(c.out)
		}
		if err := t.print(c.out); err != nil {
			return err
		}
	}
	if v.text != nil {
		return v.text(c.out)
	}
	return nil
}

// showStreamed prints one of many documents of a stream (a watch): a JSON document per line, or
// YAML documents separated by "---".
func (c *ctl) showStreamed(data any) error {
	b, err := jsonValue(data)
	if err != nil {
		return err
	}
	if c.output == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.out, "---\n%s", b)
		return err
	}
	_, err = fmt.Fprintf(c.out, "%s\n", b)
	return err
}

func (t table) print(w io.Writer) error {
	if t.title != "" {
		fmt.Fprintln(w, t.title)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(t.header) > 0 {
		fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	}
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range t.notes {
		fmt.Fprintln(w, n)
	}
	return nil
}
