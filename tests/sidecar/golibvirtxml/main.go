// golibvirtxml: reads a libvirt domain (file or - for stdin) with libvirt-go-xml-module's
// Domain.Unmarshal and writes it with Domain.Marshal, -n times, as KubeVirt's Plugin pipeline
// does around every domain hook. Build it against libvirt.org/go/libvirtxml v1.12002.0 (the copy
// KubeVirt v1.9.0 vendors; docs/SOURCES.md says how) and point PCITOPO_LIBVIRTXML at the binary
// to check testkit/plugin/libvirtxml.py against the real module.
package main

import (
	"flag"
	"fmt"
	"io/ioutil"
	"os"

	"libvirt.org/go/libvirtxml"
)

func main() {
	n := flag.Int("n", 1, "round trips")
	flag.Parse()
	var data []byte
	var err error
	if flag.Arg(0) == "-" || flag.Arg(0) == "" {
		data, err = ioutil.ReadAll(os.Stdin)
	} else {
		data, err = ioutil.ReadFile(flag.Arg(0))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s := string(data)
	for i := 0; i < *n; i++ {
		d := &libvirtxml.Domain{}
		if err := d.Unmarshal(s); err != nil {
			fmt.Fprintln(os.Stderr, "unmarshal:", err)
			os.Exit(1)
		}
		s, err = d.Marshal()
		if err != nil {
			fmt.Fprintln(os.Stderr, "marshal:", err)
			os.Exit(1)
		}
	}
	fmt.Print(s)
}
