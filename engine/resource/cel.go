package resource

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
)

// celCostLimit bounds the work of one when expression; an expression that
// exceeds it fails (the block is skipped and the failure reported), it never
// hangs a Resolve.
const celCostLimit = 100_000

// celProgram is a compiled, type-checked when expression.
type WhenProgram struct {
	prg cel.Program
}

// celEnv is the one CEL environment: a variable self of type map(string, dyn),
// bound to {rules: <result so far>}. It is built once, on first use, and never
// changed.
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("self", cel.MapType(cel.StringType, cel.DynType)),
		cel.ParserExpressionSizeLimit(MaxWhenLength),
		cel.ParserRecursionLimit(64),
	)
})

// CompileWhen parses and type-checks a when expression; the error gives the
// position of the problem.
func CompileWhen(expr string) (*WhenProgram, error) {
	if len(expr) > MaxWhenLength {
		return nil, fmt.Errorf("expression of %d bytes is over the limit of %d", len(expr), MaxWhenLength)
	}
	env, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("CEL environment: %w", err)
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("CEL: %s", strings.ReplaceAll(iss.Err().Error(), "\n", " "))
	}
	if t := ast.OutputType(); !t.IsAssignableType(cel.BoolType) {
		return nil, fmt.Errorf("CEL: the expression is of type %s, not bool", t)
	}
	prg, err := env.Program(ast, cel.CostLimit(celCostLimit), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, fmt.Errorf("CEL: %v", err)
	}
	return &WhenProgram{prg: prg}, nil
}

// Eval runs the expression with self = {rules: rules}. A runtime error, a cost
// overrun or a non-bool result is returned as an error.
func (p *WhenProgram) Eval(rules Object) (result bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			result, err = false, fmt.Errorf("CEL evaluation panicked: %v", r)
		}
	}()
	out, _, err := p.prg.Eval(map[string]any{"self": map[string]any{"rules": celValue(rules)}})
	if err != nil {
		return false, fmt.Errorf("CEL: %v", err)
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, errors.New("CEL: the expression did not yield a bool")
	}
	return bool(b), nil
}

// celValue converts a tree to CEL-native values. Numbers become doubles, as CEL
// reads JSON (google.protobuf.Value): `self.rules["limit"] > 50` and
// `double(self.rules["limit"])` both work.
func celValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, c := range t {
			m[k] = celValue(c)
		}
		return m
	case []any:
		l := make([]any, len(t))
		for i, c := range t {
			l[i] = celValue(c)
		}
		return l
	case json.Number:
		f, _ := t.Float64()
		return f
	case nil:
		return types.NullValue
	}
	return v
}
