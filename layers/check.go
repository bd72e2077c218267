package layers

import "github.com/asynctp/asynctp/internal/layerkit"

// checkParams fails when a layer's parameters are not materialized yet.
func checkParams(layer string, ps ...*Param) error {
	for _, p := range ps {
		if p != nil {
			if err := layerkit.CheckMaterialized(layer, p.Name, p.W); err != nil {
				return err
			}
		}
	}
	return nil
}
