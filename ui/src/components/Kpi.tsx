// One KPI card: a label and a figure ("—" without data), red when flagged.
export function Kpi(props: { label: string; value: string; alert?: boolean; hint?: string }) {
  return (
    <div className={`kpi${props.alert ? " kpi-alert" : ""}`} title={props.hint} data-testid={`kpi-${props.label}`}>
      <div className="kpi-value">{props.value}</div>
      <div className="kpi-label">{props.label}</div>
    </div>
  );
}
