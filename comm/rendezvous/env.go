package rendezvous

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Info is where one process stands in its job, as its launcher described it.
type Info struct {
	Rank           int    // global rank, 0 <= Rank < WorldSize
	WorldSize      int    // number of processes in the job
	LocalRank      int    // rank among the processes of this node (picks the GPU)
	LocalWorldSize int    // number of processes on this node
	MasterAddr     string // host of rank 0, where the store listens; "" only for a world of 1
	MasterPort     int    // port of the store; 0 only for a world of 1
	JobID          string // launcher's job or run id; guards against joining another job's store
	Source         string // "asynctp", "torchrun", "slurm", "openmpi" or "single"
}

// String describes the Info in one line, for logs.
func (i Info) String() string {
	return fmt.Sprintf("rank %d/%d (local %d/%d), store %s, job %q, from %s",
		i.Rank, i.WorldSize, i.LocalRank, i.LocalWorldSize, i.masterHostPort(), i.JobID, i.Source)
}

func (i Info) masterHostPort() string {
	return joinHostPort(i.MasterAddr, i.MasterPort)
}

// Validate checks that the ranks are in range and that a world of more than
// one process names its master address and port.
func (i Info) Validate() error {
	return check(i, fieldNames)
}

// varNames are the names under which a source reports each field, so that
// errors name the variable that holds the bad value.
type varNames struct {
	source                                         string
	rank, world, localRank, localWorld, addr, port string
	job                                            string
}

var fieldNames = varNames{source: "rendezvous info", rank: "Rank", world: "WorldSize",
	localRank: "LocalRank", localWorld: "LocalWorldSize", addr: "MasterAddr", port: "MasterPort"}

var (
	asynctpVars = varNames{source: "asynctp", rank: "ASYNCTP_RANK", world: "ASYNCTP_WORLD_SIZE",
		localRank: "ASYNCTP_LOCAL_RANK", localWorld: "ASYNCTP_LOCAL_WORLD_SIZE",
		addr: "ASYNCTP_MASTER_ADDR", port: "ASYNCTP_MASTER_PORT", job: "ASYNCTP_JOB_ID"}
	torchrunVars = varNames{source: "torchrun", rank: "RANK", world: "WORLD_SIZE",
		localRank: "LOCAL_RANK", localWorld: "LOCAL_WORLD_SIZE",
		addr: "MASTER_ADDR", port: "MASTER_PORT", job: "TORCHELASTIC_RUN_ID"}
	openmpiVars = varNames{source: "openmpi", rank: "OMPI_COMM_WORLD_RANK", world: "OMPI_COMM_WORLD_SIZE",
		localRank: "OMPI_COMM_WORLD_LOCAL_RANK", localWorld: "OMPI_COMM_WORLD_LOCAL_SIZE",
		addr: "MASTER_ADDR", port: "MASTER_PORT"}
)

// FromEnv reads the launcher's variables through getenv (os.Getenv when nil).
// The first launcher whose rank or world-size variable is set wins, in this
// order: asynctp (ASYNCTP_*), torchrun (RANK, WORLD_SIZE, ...), SLURM
// (SLURM_PROCID, ...), Open MPI (OMPI_COMM_WORLD_*). With none of them set the
// process is rank 0 of 1 and Source is "single". A local rank or local world
// size that the launcher leaves out defaults to one node holding the whole
// world (LocalWorldSize = WorldSize, LocalRank = Rank % LocalWorldSize).
// Errors name the variable and the value found.
func FromEnv(getenv func(string) string) (Info, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	e := env{get: getenv}
	switch {
	case e.has(asynctpVars.rank, asynctpVars.world):
		return e.generic(asynctpVars)
	case e.has(torchrunVars.rank, torchrunVars.world):
		return e.generic(torchrunVars)
	case e.has("SLURM_PROCID"):
		return e.slurm()
	case e.has(openmpiVars.rank, openmpiVars.world):
		info, err := e.generic(openmpiVars)
		if err == nil {
			info.JobID = e.first("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")
		}
		return info, err
	}
	return Info{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, Source: "single"}, nil
}

// env reads variables with trimmed values and parses integers.
type env struct{ get func(string) string }

func (e env) str(name string) string { return strings.TrimSpace(e.get(name)) }

func (e env) has(names ...string) bool { return e.first(names...) != "" }

// first returns the value of the first of names that is set.
func (e env) first(names ...string) string {
	for _, n := range names {
		if v := e.str(n); v != "" {
			return v
		}
	}
	return ""
}

// int parses the variable name; a missing variable gives def and ok=false.
func (e env) int(source, name string, def int) (v int, ok bool, err error) {
	s := e.str(name)
	if s == "" {
		return def, false, nil
	}
	v, err = strconv.Atoi(s)
	if err != nil {
		return 0, false, fmt.Errorf("rendezvous: %s environment: %s=%q is not an integer", source, name, s)
	}
	return v, true, nil
}

// required parses a variable that must be set once its launcher is detected.
func (e env) required(n varNames, name string) (int, error) {
	v, ok, err := e.int(n.source, name, 0)
	if err == nil && !ok {
		err = fmt.Errorf("rendezvous: %s environment: %s is not set (the %s launcher sets it with the rank)", n.source, name, n.source)
	}
	return v, err
}

// generic reads a launcher that names every field in its own variable.
func (e env) generic(n varNames) (Info, error) {
	info := Info{Source: n.source, MasterAddr: e.str(n.addr)}
	if n.job != "" {
		info.JobID = e.str(n.job)
	}
	var err error
	if info.Rank, err = e.required(n, n.rank); err != nil {
		return Info{}, err
	}
	if info.WorldSize, err = e.required(n, n.world); err != nil {
		return Info{}, err
	}
	if err = e.locals(&info, n); err != nil {
		return Info{}, err
	}
	if info.MasterPort, _, err = e.int(n.source, n.port, 0); err != nil {
		return Info{}, err
	}
	return info, check(info, n)
}

// locals fills LocalWorldSize (unless already set) and LocalRank, with the
// one-node defaults for whatever is missing.
func (e env) locals(info *Info, n varNames) error {
	var err error
	if info.LocalWorldSize == 0 {
		if info.LocalWorldSize, _, err = e.int(n.source, n.localWorld, info.WorldSize); err != nil {
			return err
		}
	}
	def := info.Rank
	if info.LocalWorldSize > 0 {
		def = info.Rank % info.LocalWorldSize
	}
	info.LocalRank, _, err = e.int(n.source, n.localRank, def)
	return err
}

// check validates info, naming the variables of n in its errors.
func check(i Info, n varNames) error {
	pre := "rendezvous: " + n.source
	if n != fieldNames {
		pre += " environment"
	}
	switch {
	case i.WorldSize < 1:
		return fmt.Errorf("%s: %s=%d, want at least 1", pre, n.world, i.WorldSize)
	case i.Rank < 0 || i.Rank >= i.WorldSize:
		return fmt.Errorf("%s: %s=%d is out of range for %s=%d (want 0..%d)", pre, n.rank, i.Rank, n.world, i.WorldSize, i.WorldSize-1)
	case i.LocalWorldSize < 1 || i.LocalWorldSize > i.WorldSize:
		return fmt.Errorf("%s: %s=%d is out of range for %s=%d (want 1..%d)", pre, n.localWorld, i.LocalWorldSize, n.world, i.WorldSize, i.WorldSize)
	case i.LocalRank < 0 || i.LocalRank >= i.LocalWorldSize:
		return fmt.Errorf("%s: %s=%d is out of range for %s=%d (want 0..%d)", pre, n.localRank, i.LocalRank, n.localWorld, i.LocalWorldSize, i.LocalWorldSize-1)
	case i.MasterPort < 0 || i.MasterPort > 65535:
		return fmt.Errorf("%s: %s=%d is not a TCP port (want 1..65535)", pre, n.port, i.MasterPort)
	case i.WorldSize > 1 && i.MasterAddr == "":
		return fmt.Errorf("%s: %s is not set, but %s=%d processes need the address of rank 0's store", pre, n.addr, n.world, i.WorldSize)
	case i.WorldSize > 1 && i.MasterPort == 0:
		return fmt.Errorf("%s: %s is not set, but %s=%d processes need the port of rank 0's store", pre, n.port, n.world, i.WorldSize)
	}
	return nil
}
