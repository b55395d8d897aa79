// Command cli-reference prints spillway's command-line reference, generated
// from the flags: make manifests writes it to docs/cli-reference.md.
package main

import (
	"log"
	"os"

	"github.com/spillway-io/spillway/commands"
)

func main() {
	// Defaults of some flags; the reference shows none of this machine's.
	for _, v := range []string{"DATABASE_URL", "BROKER_URL", "SPILLWAY_DRAINER_IMAGE", "POD_NAME"} {
		_ = os.Unsetenv(v)
	}
	if err := commands.WriteReference(os.Stdout); err != nil {
		log.Fatal(err)
	}
}
