package restore

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestTokenize(t *testing.T) {
	got, err := Tokenize(`-A X -m comment --comment "a \"b\" c" -j Y`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-A", "X", "-m", "comment", "--comment", `a "b" c`, "-j", "Y"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q", got)
	}
	if JoinArgs(got) != `-A X -m comment --comment "a \"b\" c" -j Y` {
		t.Errorf("JoinArgs = %s", JoinArgs(got))
	}
	if _, err := Tokenize(`"open`); !errors.Is(err, ErrUnterminatedQuote) {
		t.Errorf("unterminated quote: error %v, want %v", err, ErrUnterminatedQuote)
	}
}

// TestTokenizeLikeIptablesRestore pins the cases FuzzTokenize found, as
// iptables-restore reads them: inside quotes a backslash escapes the next
// character, outside it is literal, and a closing quote ends the argument.
func TestTokenizeLikeIptablesRestore(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{`-m comment --comment "a \"b\" c"`, []string{"-m", "comment", "--comment", `a "b" c`}},
		{`"a \\" b`, []string{`a \`, "b"}},
		{`\"00\`, nil}, // an unterminated quote
		{`a\b "x\y"`, []string{`a\b`, "xy"}},
		{`"a"b`, []string{"a", "b"}},
		{`x"y z"`, []string{"xy z"}},
		{`"" -j`, []string{"", "-j"}},
	} {
		got, err := Tokenize(c.line)
		if c.want == nil {
			if err == nil {
				t.Errorf("Tokenize(%q) = %q, want an error", c.line, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("Tokenize(%q) = %q, %v; want %q", c.line, got, err, c.want)
		}
	}
	if got := JoinArgs([]string{`a \`, `"q"`, "plain"}); got != `"a \\" "\"q\"" plain` {
		t.Errorf("JoinArgs = %s", got)
	}
}

// FuzzTokenize: a restore line splits without panicking, and the arguments
// joined again (JoinArgs, as the renderer writes them) split back to the
// same arguments. Its seed corpus (testdata/fuzz/FuzzTokenize) holds rule
// lines of the iptables backend's restore goldens and the crashers found.
func FuzzTokenize(f *testing.F) {
	f.Add(`-A X -m comment --comment "a \"b\" c" -j Y`)
	f.Fuzz(func(t *testing.T, line string) {
		if strings.ContainsAny(line, "\n\r") {
			return // restore input is split into lines first
		}
		args, err := Tokenize(line)
		if err != nil {
			return
		}
		joined := JoinArgs(args)
		again, err := Tokenize(joined)
		if err != nil {
			t.Fatalf("Tokenize(%q) = %q, joined %q, which does not split: %v", line, args, joined, err)
		}
		if !slices.Equal(args, again) {
			t.Fatalf("Tokenize(%q) = %q, joined %q, splits to %q", line, args, joined, again)
		}
	})
}
