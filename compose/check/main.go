// Validates compose files with compose-go, the loader `docker compose config` uses, for a
// machine without the compose plugin: `cd compose/check && go run . ../docker-compose.yml`
// prints the normalized project (the demo profile included) or the first error, exit 1.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	opts, err := cli.NewProjectOptions(os.Args[1:], cli.WithOsEnv, cli.WithDotEnv, cli.WithProfiles([]string{"demo"}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid:", err)
		os.Exit(1)
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(string(out))
}
